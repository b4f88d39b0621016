"""Reading text: any readable path or `-`, compressed or not, checked line by line.

Generic on purpose (it knows nothing of data directories or stages), so every command that
reads a user's text (prepare's corpora, translate's input, score's hypotheses and
references) shares one set of rules and one set of error messages:

- `-` is standard input, and any path the system can read is accepted: a regular file, a
  FIFO, `/dev/stdin`, a process substitution `<(zcat f.gz)`. A directory is refused.
- gzip, xz and bzip2 are recognised by their first bytes, never by the file name, so
  `val.en.gz`, a renamed file and a compressed pipe all read as text. Only as many bytes
  are looked at as could still be a magic number: an interactive user who types "hi" is
  not kept waiting for six bytes.
- One policy for bytes that are not text: invalid UTF-8 or a NUL byte (binary data) stops
  with `file:line`, or, when the caller asked for `replace`, becomes U+FFFD and is counted,
  so the command can warn with the count and the first place.
- Lines are streamed (memory does not grow with the corpus), and two parallel files whose
  line counts differ are refused: every pair after the first missing line would be wrong.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import lzma
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nmt_cli.errors import NmtError, UsageError

STDIN = "-"
BAD_UTF8_CHOICES = ("error", "replace")
# characters that str.splitlines() and universal-newline readers take as line ends: inside a
# sentence they would split it in two in every line-based file downstream
_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\n]")
# the first bytes of the compressed formats we read, and how to open each
_MAGIC: dict[bytes, str] = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2"}
_READ_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError)


def one_line(text: str | None) -> str:
    """A sentence as one stripped line: inner line-break characters become spaces."""
    return _LINE_BREAKS.sub(" ", text or "").strip()


def display_name(path: str | Path) -> str:
    """How messages name an input: `stdin` for `-`, the path otherwise."""
    return "stdin" if str(path) == STDIN else str(path)


def check_readable(path: str | Path) -> None:
    """Refuse, before any work, an input that cannot be read: missing, a directory, or
    not readable by this user. Anything else readable (FIFO, device, `-`) is accepted."""
    if str(path) == STDIN:
        return
    p = Path(path)
    if not p.exists():
        raise NmtError(f"{p}: no such file")
    if p.is_dir():
        raise NmtError(f"{p}: is a directory; give a text file")
    if not os.access(p, os.R_OK):
        raise NmtError(f"{p}: permission denied")


class _Prefixed(io.RawIOBase):
    """A raw stream that first returns the bytes already read from it (to sniff them)."""

    def __init__(self, head: bytes, raw: BinaryIO, close_raw: bool) -> None:
        self._head, self._raw, self._close_raw = head, raw, close_raw
        self._read = _read_available(raw)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._read(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        if self._close_raw and not self.closed:
            self._raw.close()
        super().close()


def _read_available(raw: BinaryIO) -> Callable[[int], bytes]:
    """A read that returns what is available rather than waiting for `n` bytes."""
    return getattr(raw, "read1", raw.read)


def _sniff(raw: BinaryIO) -> bytes:
    """The first bytes of a stream: while they could still begin a magic number, read on
    (each read returns what is available, so an interactive line is never held back)."""
    read = _read_available(raw)
    head = b""
    while True:
        longer = [m for m in _MAGIC if len(m) > len(head) and m.startswith(head)]
        if not longer:
            return head
        chunk = read(max(len(m) for m in longer) - len(head))
        if not chunk:
            return head
        head += chunk


def _open_raw(path: str | Path) -> tuple[BinaryIO, bool]:
    """An unbuffered byte stream of `path` (stdin for `-`) and whether we may close it."""
    if str(path) == STDIN:
        try:
            return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False), True
        except (OSError, AttributeError, ValueError):  # a stdin without a descriptor
            return sys.stdin.buffer, False
    try:
        return open(path, "rb", buffering=0), True
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NmtError(f"{path}: is a directory; give a text file") from None
    except PermissionError:
        raise NmtError(f"{path}: permission denied") from None
    except OSError as exc:
        raise NmtError(f"{path}: cannot be read ({exc.strerror})") from None


def open_binary(path: str | Path) -> BinaryIO:
    """Open `path` (or stdin for `-`) for reading bytes, decompressing gzip, xz or bzip2
    content whatever the file is called."""
    raw, close = _open_raw(path)
    try:
        head = _sniff(raw)
    except OSError as exc:
        raw.close()
        raise NmtError(f"{display_name(path)}: cannot be read ({exc.strerror})") from None
    stream = io.BufferedReader(_Prefixed(head, raw, close), buffer_size=1 << 20)
    kind = next((k for m, k in _MAGIC.items() if head.startswith(m)), "")
    if kind == "gzip":
        return io.BufferedReader(gzip.GzipFile(fileobj=stream, mode="rb"), 1 << 20)
    if kind == "xz":
        return io.BufferedReader(lzma.LZMAFile(stream, "rb"), 1 << 20)
    if kind == "bzip2":
        return io.BufferedReader(bz2.BZ2File(stream, "rb"), 1 << 20)
    return stream


def raw_lines(path: str | Path) -> Iterator[bytes]:
    """Raw lines of a file, with read errors of damaged compressed data as NmtError."""
    fh = open_binary(path)
    try:
        yield from fh
    except _READ_ERRORS as exc:
        raise NmtError(
            f"{display_name(path)}: unreadable ({exc}); is the file truncated?"
        ) from None
    finally:
        fh.close()


@dataclass
class LineDecoder:
    """The text policy: bytes that are not UTF-8 text (invalid UTF-8, NUL bytes) stop with
    the file and line, or, with "replace", become U+FFFD and are counted."""

    on_bad_utf8: str = "error"
    replaced: int = 0
    first_replaced: str = ""  # file:line of the first replaced line, for the warning

    def __post_init__(self) -> None:
        if self.on_bad_utf8 not in BAD_UTF8_CHOICES:
            raise UsageError(f"--on-bad-utf8 {self.on_bad_utf8!r}: use error or replace")

    def decode(self, raw: bytes, path: str | Path, lineno: int) -> str:
        """One line's text, stripped, with inner line breaks as spaces."""
        try:
            text = raw.decode("utf-8")
            bad = text.find("\x00")
        except UnicodeDecodeError as exc:
            text, bad = "", -1
            problem = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        else:
            problem = f"a NUL byte at column {bad + 1}: binary data, not text" if bad >= 0 else ""
        if problem:
            if self.on_bad_utf8 != "replace":
                raise NmtError(
                    f"{display_name(path)}:{lineno}: {problem}; fix the input or pass "
                    "--on-bad-utf8 replace"
                )
            self.replaced += 1
            self.first_replaced = self.first_replaced or f"{display_name(path)}:{lineno}"
            text = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        if lineno == 1:
            text = text.lstrip("\ufeff")
        return one_line(text)

    def warning(self) -> str:
        """What to tell the user after reading, or "" when nothing was replaced."""
        if not self.replaced:
            return ""
        return (
            f"{self.replaced:,} line(s) with invalid UTF-8 or NUL bytes had them replaced "
            f"by U+FFFD (first: {self.first_replaced})"
        )


def read_lines(path: str | Path, decoder: LineDecoder | None = None) -> list[str]:
    """Every line of a text file (or stdin), decoded by the text policy."""
    decoder = decoder or LineDecoder()
    return [decoder.decode(raw, path, n) for n, raw in enumerate(raw_lines(path), start=1)]


@dataclass
class StreamDecoder:
    """Decodes the lines of one stream in order, counting them for `file:line` messages
    (for readers such as translate's read-ahead, which hand over one raw line at a time)."""

    path: str | Path
    decoder: LineDecoder = field(default_factory=LineDecoder)
    lineno: int = 0

    def __call__(self, raw: bytes) -> str:
        self.lineno += 1
        return self.decoder.decode(raw, self.path, self.lineno)


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
        src_lines, tgt_lines = raw_lines(self.src_path), raw_lines(self.tgt_path)
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
