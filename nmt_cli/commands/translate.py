"""`nmt translate`: raw text in, detokenized translations out (stdin/stdout or files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nmt_cli import collector
from nmt_cli.commands.common import (
    Verbosity,
    err_console,
    info,
    on_bad_utf8_option,
    quiet_option,
    user_errors,
    verbose_option,
    warn,
)
from nmt_cli.commands.progress import CountProgress
from nmt_cli.config import DECODE_PRECISIONS, DecodeConfig, DecodePrecision
from nmt_cli.core.settings import SettingError
from nmt_cli.errors import UsageError

if TYPE_CHECKING:
    from nmt_cli.engines.translate.ray_corpus import RayJob

FALLBACK = "decoding with the slower Python step"
_D = DecodeConfig()  # the defaults: the paper's decoding settings (section 6.1)
# the recipe's decode.* keys as this command's flags, for messages about their values
_FLAGS = {
    "decode.beam_size": "--beam",
    "decode.length_penalty": "--alpha",
    "decode.max_len_a": "--max-len-a",
    "decode.max_len_b": "--max-len-b",
    "decode.nbest": "--nbest",
    "decode.batch_sentences": "--batch-size",
    "decode.batch_tokens": "--batch-tokens",
    "decode.threads": "--threads",
    "decode.workers": "--workers",
    "decode.buffer_lines": "--buffer-lines",
}


def translate(
    model: list[Path] = typer.Option(
        ...,
        "--model",
        "-m",
        metavar="PATH",
        help="Checkpoint (.pt); repeat: an ensemble.",
    ),
    input: list[Path] = typer.Option(
        [],
        "--input",
        "-i",
        metavar="PATH",
        help="Text; default or -: stdin. --ray: repeatable.",
        show_default=False,
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output; default or -: stdout; .gz compresses."
    ),
    beam: int = typer.Option(_D.beam_size, "--beam", help="Beam size; 1 = greedy."),
    alpha: float = typer.Option(
        _D.length_penalty, "--alpha", help="GNMT length penalty, see lp(Y) above."
    ),
    max_len_a: float = typer.Option(
        _D.max_len_a, "--max-len-a", help="Max output = a * |src| + b."
    ),
    max_len_b: int = typer.Option(_D.max_len_b, "--max-len-b", help="See --max-len-a."),
    nbest: int = typer.Option(
        _D.nbest,
        "--nbest",
        help="K best a line: N ||| text ||| score ||| logprob",
        show_default=False,
    ),
    batch_size: int = typer.Option(
        _D.batch_sentences,
        "--batch-size",
        help="Sentences a batch; default 0: 64 (CPU), 128 (GPU).",
        show_default=False,
    ),
    batch_tokens: int = typer.Option(
        _D.batch_tokens,
        "--batch-tokens",
        help="Padded source tokens a batch; default 0: any.",
        show_default=False,
    ),
    precision: str = typer.Option(
        _D.precision, "--precision", help="fp32, bf16, fp16, int8 or auto."
    ),
    device: str = typer.Option(_D.device, "--device", help="cpu, cuda, cuda:N or auto."),
    threads: int = typer.Option(
        _D.threads,
        "--threads",
        help="CPU threads; default 0: all usable (--ray: below).",
        show_default=False,
    ),
    workers: int = typer.Option(
        _D.workers,
        "--workers",
        help="Batches at once on CPU; default 0: one a thread.",
        show_default=False,
    ),
    buffer_lines: int = typer.Option(
        _D.buffer_lines, "--buffer-lines", help="Lines sorted by length together."
    ),
    python_step: bool = typer.Option(
        not _D.compiled_step, "--python-step", help="CPU: decode in Python, not in C++."
    ),
    as_json: bool = typer.Option(False, "--json", help="JSON lines with scores and timing."),
    alignment: bool = typer.Option(
        False, "--alignment", help="Add Moses 'i-j' word alignments (see below)."
    ),
    alignment_layer: int = typer.Option(
        0,
        "--alignment-layer",
        help="Decoder layer aligning; default 0: the penultimate.",
        show_default=False,
    ),
    constraints: Path | None = typer.Option(
        None, "--constraints", help="Target phrases each line must hold (see below)."
    ),
    prefix: str | None = typer.Option(None, "--prefix", help="Target prefix of every line."),
    prefix_file: Path | None = typer.Option(
        None, "--prefix-file", help="Target prefix of each line, one a line."
    ),
    on_bad_utf8: str = on_bad_utf8_option(),
    ray: bool = typer.Option(
        False, "--ray", help="Translate on a Ray cluster (below; the ray extra)."
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        metavar="ADDRESS",
        help="host:port, ray://host:port or local; implies --ray.",
        show_default=False,
    ),
    parts: bool = typer.Option(
        False, "--parts", help="--ray: -o is a directory of parts with a manifest."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="--ray: keep the blocks a stopped run wrote in -o."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Translate raw text with beam search.

    The paper's settings are the defaults: beam 4, alpha 0.6, at most |src| + 50
    tokens. One output line per input line, always; an empty line gives an empty
    line. Compressed input (gzip, xz, bzip2) is recognised by its content; a
    regular output file is replaced only when all its lines are written.

    \b
    Hypotheses are ranked by the GNMT length penalty (--alpha):
      score(Y) = log P(Y|X) / lp(Y),  lp(Y) = ((5 + |Y|) / 6) ** alpha
    with |Y| counting the end-of-sentence token.

    \b
    --alignment adds each sentence's source-target word alignment, 0-based
    word pairs from the cross-attention of one decoder layer averaged over
    heads: 'text ||| 0-0 1-2', or an 'alignment' field in JSON. The
    penultimate layer aligns best (Garg et al., 2019); --alignment-layer N
    (1-based) picks another and implies --alignment.

    Several --model checkpoints decode as one ensemble: their log-probabilities
    are averaged at every step (they must share one vocabulary; alignments
    average the members' attention).

    \b
    --constraints FILE: line N of FILE holds the target phrases (terminology)
    line N's translation must contain, separated by tabs; an empty line, none.
    Each phrase, once begun, is written whole; the end comes only after all
    of them. --prefix TEXT (or --prefix-file, one a line) is where every
    translation starts. A parsing model's outputs are always well-formed
    trees with one slot per input word.

    \b
    --ray translates on a Ray cluster: --ray-address's, RAY_ADDRESS's, the
    one this machine joined with `ray start`, or else a new one here. The
    inputs (-i, repeatable) are read as one text and cut into blocks of
    --buffer-lines lines, each translated by one of --workers actors
    (default: as many as the cluster's CPUs hold) of one model and
    --threads threads (default 1) and written as soon as it is back; the
    output is the same as without --ray. With --parts, -o DIR gets a part
    a block and a manifest.json instead of one file. After a stop, the same
    command with --resume translates only the blocks not yet written. The
    checkpoints must be at the same path on every machine.
    """
    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        cfg = decode_config_of_flags(
            beam_size=beam, length_penalty=alpha, max_len_a=max_len_a, max_len_b=max_len_b,
            nbest=nbest, batch_sentences=batch_size, batch_tokens=batch_tokens,
            precision=precision_flag(precision), device=device, threads=threads, workers=workers,
            buffer_lines=buffer_lines, compiled_step=not python_step,
        )  # fmt: skip
        alignment = alignment or alignment_layer != 0  # a layer alone asks for alignments
        layer = alignment_layer if alignment else None  # 0: the penultimate; None: none
        if ray or ray_address is not None:
            if constraints or prefix is not None or prefix_file:
                raise UsageError("--constraints, --prefix and --prefix-file are not for --ray")
            from nmt_cli.engines.translate.ray_corpus import RayJob

            job = RayJob(
                models=tuple(model), cfg=cfg, inputs=tuple(input or [Path("-")]), output=output,
                parts=parts, resume=resume, address=ray_address, as_json=as_json,
                alignment_layer=layer, on_bad_utf8=on_bad_utf8, ray_logs=verbose,
            )  # fmt: skip
            return translate_on_ray(job, verbosity)
        for flag, given in (("--parts", parts), ("--resume", resume), ("-i twice", len(input) > 1)):
            if given:
                raise UsageError(f"{flag} is for --ray only")
        with collector.paused():  # the engine's imports, PyTorch's among them
            from nmt_cli.engines.translate.stream import translate_file

        warn_emulated_bf16(cfg.precision, cfg.device)
        report = translate_file(
            model,
            cfg,
            input[0] if input else None,
            output,
            as_json=as_json,
            alignment_layer=layer,
            on_bad_utf8=on_bad_utf8,
            on_compile=lambda text: info(text, verbosity),
            on_fallback=lambda reason: warn(f"{FALLBACK}: {reason}"),
            progress=line_progress(verbosity),
            on_plan=(lambda line: info(f"plan: {line}", verbosity)) if verbose else None,
            prefix=prefix,
            prefix_file=prefix_file,
            constraints=constraints,
        )
        for message in report.warnings():
            warn(message)
        info(report.summary(), verbosity)


def translate_on_ray(job: RayJob, verbosity: Verbosity) -> None:
    """The `--ray` side of the command: the engine, then its warnings and summary."""
    from nmt_cli.engines.translate import ray_corpus

    report = ray_corpus.translate_on_ray(job, progress=line_progress(verbosity))
    for message in report.warnings():
        warn(message)
    info(report.summary(), verbosity)


def line_progress(verbosity: Verbosity) -> Callable[[int | None], CountProgress] | None:
    """Progress in lines translated, for a person watching."""
    if not verbosity.progress:
        return None
    return lambda total: CountProgress(err_console, "translate", total)


def warn_emulated_bf16(precision: str, device: str) -> None:
    """bf16 asked for on a CPU without bf16 units: say so first, with the slowdown."""
    from nmt_cli.cpu_level import bf16_emulation_warning
    from nmt_cli.engines.translate.loading import resolve_device

    text = bf16_emulation_warning(precision, resolve_device(device), "--precision")
    if text is not None:
        warn(text)


def decode_config_of_flags(**settings: object) -> DecodeConfig:
    """The decoding settings, with a bad value reported under its flag (exit code 2)."""
    if settings["precision"] not in DECODE_PRECISIONS:
        raise UsageError(
            f"--precision {settings['precision']!r}: use fp32, bf16, fp16, int8 or auto"
        )
    try:
        return DecodeConfig(**settings)  # type: ignore[arg-type]
    except SettingError as exc:
        flag = _FLAGS.get(exc.key, exc.key)
        raise UsageError(f"{flag}{str(exc).removeprefix(exc.key)}") from None


def precision_flag(value: str) -> DecodePrecision:
    return value  # type: ignore[return-value]  # checked against the Literal above
