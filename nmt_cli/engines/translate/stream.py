"""The streaming side of `nmt translate`: a file (or stdin) in, formatted lines out.

`translate_file` is the command's whole job, callable without the CLI: check the input
and output, load the `Translator`, read the input ahead in chunks (`chunks.read_chunks`),
translate and write chunk after chunk, report. `translate_stream` hands each chunk to the
translator and the results to an `emit` callback before reading on;
`format_translations` turns one chunk's results into plain, n-best or JSON lines.
"""

from __future__ import annotations

import contextlib
import json
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nmt_cli import collector
from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.chunks import read_chunks
from nmt_cli.engines.translate.forced_input import ForcedReader, forced_files
from nmt_cli.engines.translate.translator import TranslatedHypothesis, Translation, Translator
from nmt_cli.heap import Releaser
from nmt_cli.outputs import check_output_path, open_output
from nmt_cli.text_io import (
    LineDecoder,
    StreamDecoder,
    check_readable,
    display_name,
    open_binary,
    raw_lines,
)


@dataclass
class TranslateStats:
    lines: int = 0
    sentences: int = 0  # non-empty lines sent to the model
    target_tokens: int = 0  # of the best hypotheses
    truncated: int = 0
    truncated_lines: list[int] = field(default_factory=list)  # first few, 1-based
    decode_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def sentences_per_second(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.target_tokens / self.seconds if self.seconds > 0 else 0.0


def translate_stream(
    translator: Translator,
    chunks: Iterable[list[str]],
    emit: Callable[[list[Translation], int, float], None],
    forced: ForcedReader | None = None,
) -> TranslateStats:
    """Translate chunk after chunk; `emit(translations, first_line, seconds)` writes each
    chunk's results (in input order) before the next chunk is read. `forced` reads what
    each line's translation must hold along with the lines."""
    stats = TranslateStats()
    start = time.perf_counter()
    for chunk in chunks:
        t0 = time.perf_counter()
        wants = forced.take(chunk) if forced is not None else None
        results = translator.translate_chunk(chunk, forced=wants)
        seconds = time.perf_counter() - t0
        stats.decode_seconds += seconds
        for n, result in enumerate(results, start=stats.lines + 1):
            if result.truncated:
                stats.truncated += 1
                if len(stats.truncated_lines) < 5:
                    stats.truncated_lines.append(n)
            if result.hypotheses:
                stats.sentences += 1
                stats.target_tokens += result.hypotheses[0].length
        emit(results, stats.lines + 1, seconds)
        stats.lines += len(chunk)
    if forced is not None:
        forced.finish()
    stats.seconds = time.perf_counter() - start
    return stats


def format_translations(
    results: list[Translation],
    first_line: int,
    seconds: float,
    nbest: int,
    as_json: bool,
    alignment: bool = False,
) -> bytes:
    """The output of one chunk.

    Plain: one line per input line (the best translation). With nbest > 1, Moses n-best
    lines `N ||| text ||| score ||| log_prob` (N the 0-based input line), nbest per input.
    JSON: one object per input line with the source, the hypotheses and their scores, and
    the decoding time of the chunk the line was translated in.
    With `alignment`, plain lines become `text ||| i-j ...` and n-best lines end with
    `||| i-j ...` (an empty line's alignment is empty); JSON hypotheses get "alignment".
    """
    out: list[str] = []
    for n, result in enumerate(results, start=first_line):
        if as_json:
            record = {
                "line": n,
                "source": result.source,
                "hypotheses": [
                    {
                        "text": h.text,
                        "score": h.score,
                        "log_prob": h.log_prob,
                        "tokens": h.length,
                        **({"alignment": h.alignment} if h.alignment is not None else {}),
                    }
                    for h in result.hypotheses
                ],
                "truncated": result.truncated,
                "timing": {"chunk_lines": len(results), "chunk_seconds": round(seconds, 6)},
            }
            out.append(json.dumps(record, ensure_ascii=False))
        elif nbest > 1:
            hyps = result.hypotheses or [TranslatedHypothesis("", 0.0, 0.0, 0, "")]
            out.extend(
                f"{n - 1} ||| {h.text} ||| {h.score:.6f} ||| {h.log_prob:.6f}"
                + (f" ||| {h.alignment or ''}" if alignment else "")
                for h in hyps
            )
        elif alignment:
            best = result.hypotheses[0].alignment if result.hypotheses else ""
            out.append(f"{result.text} ||| {best or ''}")
        else:
            out.append(result.text)
    text = "".join(line + "\n" for line in out)
    return text.encode("utf-8", errors="replace")


def truncation_warning(stats: TranslateStats, max_source: int) -> str:
    """What to tell of the lines cut to the model's positions (`stats.truncated` > 0)."""
    lines = ", ".join(map(str, stats.truncated_lines))
    return (
        f"{stats.truncated} input line(s) longer than {max_source} "
        f"subword tokens were truncated (lines {lines}"
        f"{', ...' if stats.truncated > len(stats.truncated_lines) else ''})"
    )


class Progress(Protocol):
    def advance(self, n: int = 1) -> None: ...


@dataclass(frozen=True)
class FileReport:
    """What `translate_file` did, for the command to tell."""

    stats: TranslateStats
    translator: Translator  # closed; what it decoded with (precision, device, ...)
    replaced: str  # the text policy's warning about bytes that were not text, or ""

    def warnings(self) -> list[str]:
        """Replaced bytes, then truncated lines."""
        stats, out = self.stats, [self.replaced] if self.replaced else []
        if stats.truncated:
            out.append(truncation_warning(stats, self.translator.max_source))
        return out

    def summary(self) -> str:
        stats, t = self.stats, self.translator
        return (
            f"translated {stats.lines:,} lines in {stats.seconds:.2f}s "
            f"({stats.sentences_per_second:.1f} sent/s, {stats.tokens_per_second:.0f} tok/s; "
            f"beam {t.cfg.beam_size}, {t.precision}, {t.device}, {t.threads} threads, "
            f"{t.workers} batches at once)"
        )


def translate_file(
    models: Sequence[Path],
    cfg: DecodeConfig,
    input: Path | None = None,
    output: Path | None = None,
    *,
    as_json: bool = False,
    alignment_layer: int | None = None,
    on_bad_utf8: str = "error",
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] | None = None,
    progress: Callable[[int | None], AbstractContextManager[Progress]] | None = None,
    on_plan: Callable[[str], None] | None = None,
    prefix: str | None = None,
    prefix_file: Path | None = None,
    constraints: Path | None = None,
) -> FileReport:
    """Translate `input` (None or `-`: stdin) into `output` (None or `-`: stdout), one line
    per line, as `nmt translate` does.

    Input and output are checked before the model is loaded. `alignment_layer` asks for
    word alignments (0: the default layer; None: none). `progress(total lines or None)`
    gives what is told of every chunk written. A regular output file is replaced only when
    every line is written; freed heap pages go back to the system after each chunk.
    `prefix` (every line's), `prefix_file` (one a line) and `constraints` (a file: per
    line, tab-separated phrases) say what the translations must hold (forced.py).
    """
    decoder = StreamDecoder(display_name(input or "-"), LineDecoder(on_bad_utf8))
    for path in (input, prefix_file, constraints):
        if path is not None:
            check_readable(path)
    check_output_path(output, inputs=[*models, input, prefix_file, constraints])
    with collector.paused():  # start-up (nmt_cli/collector.py)
        translator = Translator.load(models, cfg, alignment_layer, on_compile, on_fallback)
    room = translator.max_target
    forced = forced_files(
        translator.vocab.tgt, room, prefix, prefix_file, constraints, decoder.decoder
    )
    if on_plan is not None:
        for line in translator.plan:
            on_plan(line)
    total = _line_count(input) if progress else None
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(contextlib.closing(open_binary(input or "-")))
        sink = stack.enter_context(open_output(output))
        shown = stack.enter_context(progress(total)) if progress else None
        releaser = Releaser()
        alignment = alignment_layer is not None

        def emit(results: list[Translation], first: int, seconds: float) -> None:
            sink.write(format_translations(results, first, seconds, cfg.nbest, as_json, alignment))
            sink.flush()  # a line-at-a-time user is answered before the next line
            if shown is not None:
                shown.advance(len(results))
            releaser.after_chunk()  # what the chunk freed goes back to the system

        chunks = read_chunks(source, cfg.buffer_lines, decode=decoder, name=str(decoder.path))
        stack.enter_context(translator)  # stops its workers, waiting only after a clean end
        stats = translate_stream(translator, chunks, emit, forced)
    return FileReport(stats, translator, decoder.decoder.warning())


def _line_count(path: Path | None) -> int | None:
    """Lines of a regular input file, for a progress bar (a pipe can be read once only)."""
    if path is None or str(path) == "-" or not stat.S_ISREG(path.stat().st_mode):
        return None
    return sum(1 for _ in raw_lines(path))
