"""`nmt translate`: raw text in, detokenized translations out (stdin/stdout or files)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import typer

from nmt_cli.api import Translator
from nmt_cli.commands.common import err_console, user_errors
from nmt_cli.config import DecodeConfig, Precision
from nmt_cli.core.files import atomic_path
from nmt_cli.engines.translate import (
    LENGTH_PENALTY_HELP,
    Translation,
    format_translations,
    read_chunks,
    translate_stream,
)
from nmt_cli.errors import NmtError


def translate(
    model: list[Path] = typer.Option(
        ...,
        "--model",
        "-m",
        help="Checkpoint (.pt) to translate with; repeat it to decode with the ensemble of "
        "several (their log-probabilities averaged at every step; one vocabulary).",
    ),
    input: Path | None = typer.Option(None, "--input", "-i", help="Input file (default: stdin)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output file, written atomically (default: stdout)."
    ),
    beam: int = typer.Option(4, "--beam", help="Beam size; 1 = greedy."),
    alpha: float = typer.Option(0.6, "--alpha", help=LENGTH_PENALTY_HELP + "."),
    max_len_a: float = typer.Option(1.0, "--max-len-a", help="Max output = a * |src| + b."),
    max_len_b: int = typer.Option(50, "--max-len-b", help="See --max-len-a."),
    nbest: int = typer.Option(1, "--nbest", help="Print the K best as 'N ||| text ||| score'."),
    batch_size: int = typer.Option(128, "--batch-size", help="Sentences per batch."),
    batch_tokens: int = typer.Option(
        0, "--batch-tokens", help="Padded source tokens per batch; 0 = no limit."
    ),
    precision: str = typer.Option("auto", "--precision", help="fp32, bf16, fp16 or auto."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    threads: int = typer.Option(0, "--threads", help="CPU threads; 0 = all cores."),
    workers: int = typer.Option(
        0, "--workers", help="Batches decoded at once on CPU; 0 = one per thread."
    ),
    as_json: bool = typer.Option(False, "--json", help="JSON lines with scores and timing."),
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
        translator = Translator.load(model, cfg)
        with contextlib.ExitStack() as stack:
            source: BinaryIO = stack.enter_context(_open_input(input))
            if output is None:
                sink: BinaryIO = sys.stdout.buffer
            else:
                sink = stack.enter_context(open(stack.enter_context(atomic_path(output)), "wb"))

            def emit(results: list[Translation], first: int, seconds: float) -> None:
                sink.write(format_translations(results, first, seconds, cfg.nbest, as_json))
                sink.flush()

            try:
                chunks = read_chunks(source, cfg.buffer_lines)
                stats = translate_stream(translator.engine, chunks, emit)
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
                f"{translator.device}, {translator.threads} threads, "
                f"{translator.workers} batches at once)",
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
