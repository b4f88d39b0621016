"""The streaming side of `nmt translate`: chunks of input lines in, formatted output out.

Lines arrive in chunks from a read-ahead buffer (`read_chunks`): a chunk is whatever is
available, up to `buffer_lines`, so an interactive user is answered at once and a file of
a million lines is translated in bounded memory. `translate_stream` hands each chunk to a
`Translator` and the results to an `emit` callback before reading on;
`format_translations` turns one chunk's results into plain, n-best or JSON lines.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from nmt_cli.engines.translate import TranslatedHypothesis, Translation, Translator
from nmt_cli.errors import NmtError


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


def decode_line(raw: bytes) -> str:
    """Bytes of one input line -> text; invalid UTF-8 becomes U+FFFD, never an error."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", errors="replace")


def read_chunks(
    stream: BinaryIO,
    max_lines: int,
    wait_s: float = 0.002,
    decode: Callable[[bytes], str] = decode_line,
    name: str = "the input",
) -> Iterator[list[str]]:
    """Chunks of lines as they become available, at most `max_lines` each.

    A reader thread feeds a bounded queue. A chunk starts with the next line (waiting for
    it as long as needed), then takes what else arrives within `wait_s`, then whatever is
    already queued: a person typing or a program sending one line at a time gets each
    line translated at once, a file or a fast pipe fills whole chunks (lines that arrive
    while a chunk is translated queue up for the next), and at most about two chunks of
    text are ever held. `wait_s` is short because it is paid on every line a server
    sends: 50 ms here doubled the answer time of a one-line request (~45 ms at batch 1). `decode`
    turns each raw line into text, in input order (the CLI passes the shared text policy
    of `nmt_cli/text_io.py`, which names the file and line of bytes that are not text).
    """
    lines: queue.Queue[bytes | None] = queue.Queue(maxsize=max_lines)
    failure: list[BaseException] = []

    def reader() -> None:
        try:
            for raw in iter(stream.readline, b""):
                lines.put(raw)
        except BaseException as exc:  # reported by the consumer, not lost in the thread
            failure.append(exc)
        finally:
            lines.put(None)

    threading.Thread(target=reader, name="nmt-read-ahead", daemon=True).start()
    ended = False
    while not ended:
        item = lines.get()
        if item is None:
            break
        chunk = [decode(item)]
        deadline = time.monotonic() + wait_s
        while len(chunk) < max_lines:
            left = deadline - time.monotonic()
            try:
                item = lines.get(timeout=left) if left > 0 else lines.get_nowait()
            except queue.Empty:
                break
            if item is None:
                ended = True
                break
            chunk.append(decode(item))
        yield chunk
    if failure:
        raise NmtError(f"{name}: reading failed ({failure[0]}); is the file truncated?")


def translate_stream(
    translator: Translator,
    chunks: Iterable[list[str]],
    emit: Callable[[list[Translation], int, float], None],
) -> TranslateStats:
    """Translate chunk after chunk; `emit(translations, first_line, seconds)` writes each
    chunk's results (in input order) before the next chunk is read."""
    stats = TranslateStats()
    start = time.perf_counter()
    for chunk in chunks:
        t0 = time.perf_counter()
        results = translator.translate(chunk)
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
