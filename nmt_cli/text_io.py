"""Reading text files: plain or gzipped, one sentence a line, checked as we go.

Generic on purpose (it knows nothing of data directories or stages), so every command that
reads a user's text shares one set of rules and one set of error messages. Both sides are
streamed line by line (memory does not grow with the corpus), and every user mistake
surfaces as an `NmtError` naming the file and line: a missing or corrupt file, bytes that
are not UTF-8 (unless the caller asked to replace them), and sides whose line counts
differ, which would silently misalign every pair after the first missing line.
"""

from __future__ import annotations

import gzip
import io
import itertools
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nmt_cli.errors import NmtError

BAD_UTF8_CHOICES = ("error", "replace")
# characters that str.splitlines() and universal-newline readers take as line ends: inside a
# sentence they would split it in two in every line-based file downstream
_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\n]")


def one_line(text: str | None) -> str:
    """A sentence as one stripped line: inner line-break characters become spaces."""
    return _LINE_BREAKS.sub(" ", text or "").strip()


def open_binary(path: Path) -> BinaryIO:
    """Open a plain or gzipped file for reading bytes; gzip is recognised by its magic."""
    if not path.is_file():
        raise NmtError(f"{path}: no such file")
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    if gzipped:
        return io.BufferedReader(gzip.open(path, "rb"), buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


def _lines(path: Path) -> Iterator[bytes]:
    """Raw lines of a file, with read errors of a damaged gzip file turned into NmtError."""
    fh = open_binary(path)
    try:
        yield from fh
    except (gzip.BadGzipFile, EOFError, zlib.error, OSError) as exc:
        raise NmtError(f"{path}: unreadable ({exc}); is the file truncated?") from None
    finally:
        fh.close()


@dataclass
class LineDecoder:
    """UTF-8 decoding with a choice: stop with the file and line, or replace and count."""

    on_bad_utf8: str = "error"
    replaced: int = 0
    _first: set[Path] = field(default_factory=set)

    def decode(self, raw: bytes, path: Path, lineno: int) -> str:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if self.on_bad_utf8 != "replace":
                byte = raw[exc.start]
                raise NmtError(
                    f"{path}:{lineno}: not valid UTF-8 (byte 0x{byte:02x} at column "
                    f"{exc.start + 1}); fix the file or pass --on-bad-utf8 replace"
                ) from None
            self.replaced += 1
            text = raw.decode("utf-8", errors="replace")
        if lineno == 1:
            text = text.lstrip("\ufeff")
        return one_line(text)


@dataclass
class TextPairs:
    """One split as two parallel files; iterate `pairs()` to stream (source, target)."""

    src_path: Path
    tgt_path: Path
    decoder: LineDecoder = field(default_factory=LineDecoder)

    @property
    def total(self) -> int | None:
        return None

    def pairs(self) -> Iterator[tuple[str, str]]:
        src_lines, tgt_lines = _lines(self.src_path), _lines(self.tgt_path)
        for n, (a, b) in enumerate(itertools.zip_longest(src_lines, tgt_lines)):
            if a is None or b is None:
                extra_src = (a is not None) + sum(1 for _ in src_lines)
                extra_tgt = (b is not None) + sum(1 for _ in tgt_lines)
                raise NmtError(
                    f"{self.src_path} has {n + extra_src:,} lines but {self.tgt_path} has "
                    f"{n + extra_tgt:,}; parallel files need one line per sentence on both sides"
                )
            yield (
                self.decoder.decode(a, self.src_path, n + 1),
                self.decoder.decode(b, self.tgt_path, n + 1),
            )
