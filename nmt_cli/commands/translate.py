"""`nmt translate`: raw text in, detokenized translations out (stdin/stdout or files)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import typer

from nmt_cli.commands.common import err_console, user_errors
from nmt_cli.config import DecodeConfig, Precision
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.files import atomic_path
from nmt_cli.engines.attention_views import default_layer
from nmt_cli.engines.translate import (
    LENGTH_PENALTY_HELP,
    Translation,
    Translator,
    format_translations,
    read_chunks,
    set_threads,
    translate_stream,
)
from nmt_cli.errors import NmtError

_D = DecodeConfig()  # the defaults: the paper's decoding settings (section 6.1)


def translate(
    model: Path = typer.Option(..., "--model", "-m", help="Checkpoint (.pt) to translate with."),
    input: Path | None = typer.Option(None, "--input", "-i", help="Input file (default: stdin)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output file, written atomically (default: stdout)."
    ),
    beam: int = typer.Option(_D.beam_size, "--beam", help="Beam size; 1 = greedy."),
    alpha: float = typer.Option(_D.length_penalty, "--alpha", help=LENGTH_PENALTY_HELP + "."),
    max_len_a: float = typer.Option(
        _D.max_len_a, "--max-len-a", help="Max output = a * |src| + b."
    ),
    max_len_b: int = typer.Option(_D.max_len_b, "--max-len-b", help="See --max-len-a."),
    nbest: int = typer.Option(
        _D.nbest, "--nbest", help="Print the K best as 'N ||| text ||| score'."
    ),
    batch_size: int = typer.Option(_D.batch_sentences, "--batch-size", help="Sentences per batch."),
    batch_tokens: int = typer.Option(
        _D.batch_tokens, "--batch-tokens", help="Padded source tokens per batch; 0 = no limit."
    ),
    precision: str = typer.Option(_D.precision, "--precision", help="fp32, bf16, fp16 or auto."),
    device: str = typer.Option(_D.device, "--device", help="cpu, cuda, cuda:N or auto."),
    threads: int = typer.Option(_D.threads, "--threads", help="CPU threads; 0 = all cores."),
    workers: int = typer.Option(
        _D.workers, "--workers", help="Batches decoded at once on CPU; 0 = one per thread."
    ),
    as_json: bool = typer.Option(False, "--json", help="JSON lines with scores and timing."),
    alignment: bool = typer.Option(
        False,
        "--alignment",
        help="Add each sentence's source-target word alignment (Moses 'i-j' pairs, 0-based "
        "words) from cross-attention: 'text ||| 0-0 1-2', or an 'alignment' field in JSON.",
    ),
    alignment_layer: int = typer.Option(
        0,
        "--alignment-layer",
        help="Decoder layer (1-based) whose cross-attention, averaged over heads, aligns; "
        "0 = the penultimate layer, which aligns best (Garg et al., 2019). Implies --alignment.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary on stderr."),
) -> None:
    """Translate raw text with beam search (the paper: beam 4, alpha 0.6, max |src| + 50).

    One output line per input line, always; an empty line gives an empty line.
    """
    with user_errors():
        if precision not in ("auto", "fp32", "bf16", "fp16"):
            raise NmtError(f"--precision {precision!r}: use fp32, bf16, fp16 or auto")
        try:
            cfg = DecodeConfig(
                beam_size=beam, length_penalty=alpha, max_len_a=max_len_a, max_len_b=max_len_b,
                nbest=nbest, batch_sentences=batch_size, batch_tokens=batch_tokens,
                precision=_precision(precision), device=device, threads=threads, workers=workers,
            )  # fmt: skip
        except ValueError as exc:
            raise NmtError(str(exc).replace("decode.", "--")) from None
        n_threads, workers = set_threads(cfg.threads, cfg.workers)
        ckpt = load_checkpoint(model)
        layer = None
        alignment = alignment or alignment_layer != 0  # a layer alone asks for alignments
        if alignment:
            layer = alignment_layer or default_layer(ckpt.model_config.decoder_layers)
        translator = Translator.from_checkpoint(ckpt, cfg, workers, layer)
        with contextlib.ExitStack() as stack:
            source: BinaryIO = stack.enter_context(_open_input(input))
            if output is None:
                sink: BinaryIO = sys.stdout.buffer
            else:
                sink = stack.enter_context(open(stack.enter_context(atomic_path(output)), "wb"))

            def emit(results: list[Translation], first: int, seconds: float) -> None:
                sink.write(
                    format_translations(results, first, seconds, cfg.nbest, as_json, alignment)
                )
                sink.flush()

            try:
                stats = translate_stream(translator, read_chunks(source, cfg.buffer_lines), emit)
            except BrokenPipeError:  # `nmt translate ... | head`: the reader left, we stop
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(0) from None
        if stats.truncated:
            lines = ", ".join(map(str, stats.truncated_lines))
            err_console.print(
                f"[yellow]warning:[/] {stats.truncated} input line(s) longer than "
                f"{translator.max_source} subword tokens were truncated (lines {lines}"
                f"{', ...' if stats.truncated > len(stats.truncated_lines) else ''})",
                soft_wrap=True,
            )
        if not quiet:
            err_console.print(
                f"translated {stats.lines:,} lines in {stats.seconds:.2f}s "
                f"({stats.sentences_per_second:.1f} sent/s, {stats.tokens_per_second:.0f} tok/s; "
                f"beam {cfg.beam_size}, {str(translator.dtype).removeprefix('torch.')}, "
                f"{translator.device}, {n_threads} threads, {translator.workers} batches at once)",
                highlight=False,
                soft_wrap=True,
            )


def _precision(value: str) -> Precision:
    return value  # type: ignore[return-value]  # checked against the Literal above


@contextlib.contextmanager
def _open_input(path: Path | None) -> Iterator[BinaryIO]:
    if path is None:
        yield sys.stdin.buffer
        return
    if not path.is_file():
        raise NmtError(f"{path}: no such input file")
    with open(path, "rb") as fh:
        yield fh
