"""How lines become chunks: the one home of chunking for everything that translates.

A chunk is the unit a `Translator` decodes at once: its sentences are sorted by length
into batches together, and its results are handed on before the next chunk is read, so
memory stays bounded whatever the input's size.

- `chunked` cuts lines a caller already has (a list, a generator: the Python API,
  `translate_lines`) into chunks of `buffer_lines`.
- `read_chunks` reads a byte stream ahead (`nmt translate`): a chunk is whatever is
  available, up to `buffer_lines`, so an interactive user is answered at once and a file
  of a million lines still goes in whole chunks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from nmt_cli.errors import NmtError
from nmt_cli.text_io import StreamDecoder


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive chunks of `size` lines (the last one shorter), read as they are needed."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def read_chunks(
    stream: BinaryIO,
    max_lines: int,
    wait_s: float = 0.002,
    decode: Callable[[bytes], str] | None = None,
    name: str = "the input",
) -> Iterator[list[str]]:
    """Chunks of lines as they become available, at most `max_lines` each.

    A reader thread feeds a bounded queue. A chunk starts with the next line (waiting for
    it as long as needed), then takes whatever is already queued: a file or a fast pipe
    fills whole chunks (lines that arrive while a chunk is translated queue up for the
    next), and at most about two chunks of text are ever held. The first chunk, and each
    one after a chunk of several lines (the input comes in bursts), also takes what
    arrives within `wait_s` of its first line, so that lines that trickle in are
    translated together. After a chunk of one line there is no wait: a person typing, or
    a program that sends a line and waits for its answer, gives chunks of one line, and
    a wait would be paid on every line (2 ms of a one-line answer's 15-35 ms at batch 1;
    50 ms once doubled it).
    `decode` turns each raw line into text, in input order: by default the text policy of
    `nmt_cli/text_io.py` (bytes that are not text stop with `name:line`); the CLI passes
    its own, with the user's --on-bad-utf8.
    """
    decode = decode or StreamDecoder(name)
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
    ended, burst = False, True  # the first chunk waits: the input has shown no pace yet
    while not ended:
        item = lines.get()
        if item is None:
            break
        chunk = [decode(item)]
        deadline = time.monotonic() + (wait_s if burst else 0.0)
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
        burst = len(chunk) > 1
        yield chunk
    if failure:
        raise NmtError(f"{name}: reading failed ({failure[0]}); is the file truncated?")
