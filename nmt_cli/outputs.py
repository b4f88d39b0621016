"""Output paths given on the command line: checked before the work, written as Unix expects.

`check_output_path` runs before a command does anything expensive, so a mistake in `-o`
(a directory, a place that cannot be written, one of the command's own inputs) costs a
second, not an hour of decoding or averaging. `open_output` then writes: `-` is stdout; a
name ending in .gz, .xz or .bz2 is compressed to match; a regular file is replaced
atomically and a symlink, FIFO or device is written through (see `core/files.py`).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from nmt_cli.core.files import write_target, writes_through, writing
from nmt_cli.errors import NmtError

STDOUT = "-"


def is_stdout(path: str | Path | None) -> bool:
    return path is None or str(path) == STDOUT


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(
    path: str | Path | None,
    inputs: Iterable[str | Path | None] = (),
    option: str = "--output",
) -> None:
    """Refuse an output that cannot be written, or that is one of `inputs`, with one line
    naming the option; stdout (`-` or None) always passes."""
    if is_stdout(path):
        return
    assert path is not None
    given = Path(path)
    if given.is_dir():
        raise NmtError(f"{option} {given}: is a directory; name a file to write")
    for other in inputs:
        if other is None or str(other) == "-":
            continue
        other_path = Path(other)
        if _same_file(given, other_path) or write_target(given) == write_target(other_path):
            raise NmtError(
                f"{option} {given} is also an input ({other}); writing it would destroy "
                "that input: choose another output"
            )
    if writes_through(given):  # FIFO, device: written in place, so it must be writable
        if given.exists() and not os.access(given, os.W_OK):
            raise NmtError(f"{option} {given}: permission denied")
        return
    target = write_target(given)
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # missing folders are created, from the first one that exists
    if not folder.is_dir():
        raise NmtError(f"{option} {given}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise NmtError(f"{option} {given}: cannot write in {folder} (permission denied)")


def check_output_dir(path: str | Path, option: str = "--out") -> None:
    """An output directory: it may exist (as a directory) or be creatable."""
    given = Path(path)
    if given.exists() and not given.is_dir():
        raise NmtError(f"{option} {given}: exists and is not a directory; choose another")
    folder = given
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise NmtError(f"{option} {given}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise NmtError(f"{option} {given}: cannot write in {folder} (permission denied)")


@contextlib.contextmanager
def _compressed(sink: BinaryIO, name: str) -> Iterator[BinaryIO]:
    """Compress to match the output's name; the header holds no name or time, so equal
    text gives equal files."""
    if name.endswith(".gz"):
        with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0) as gz:
            yield gz  # type: ignore[misc]
    elif name.endswith(".xz"):
        with lzma.LZMAFile(sink, "wb") as xz:
            yield xz  # type: ignore[misc]
    elif name.endswith(".bz2"):
        with bz2.BZ2File(sink, "wb") as bz:
            yield bz  # type: ignore[misc]
    else:
        yield sink


@contextlib.contextmanager
def open_output(path: str | Path | None) -> Iterator[BinaryIO]:
    """A byte sink for `path`: stdout for `-` or None, else the file (see the module doc).

    The file appears (or changes) only when the block ends without an error: a failure
    halfway leaves the previous file as it was.
    """
    if is_stdout(path):
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    assert path is not None
    with writing(path) as fh, _compressed(fh, str(path)) as sink:
        yield sink
