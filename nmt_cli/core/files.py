"""Writing files so that a kill at any moment leaves either the old file or the new one.

A regular file (or a new one) is written to a temporary file beside it and renamed over
it. Anything else is written through, because replacing it would break whoever uses it:
a symlink keeps being a link (its target is written, atomically when that is a regular
file), and a FIFO, a terminal or /dev/null is opened and written like any Unix tool
writes it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def write_target(path: str | Path) -> Path:
    """The file a write to `path` should change: the end of a symlink chain, else `path`."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def writes_through(path: str | Path) -> bool:
    """Whether `path` is to be opened and written in place rather than replaced: an
    existing FIFO, device or socket (through any symlink, so /dev/stdout on a pipe), and
    anything under /dev or /proc, whose files are not ours to replace (/dev/stdout
    redirected to a log with >> must be appended to, not swapped for a new file)."""
    if str(Path(path).absolute()).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed over it.

    The temporary file lives in the same directory so the rename is atomic; on any error
    it is removed and `path` is left as it was. A symlink is followed: its target is
    replaced and the link stays.
    """
    path = write_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600; results are shared like any file a user writes (0644).
    tmp.chmod(0o644)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


_STD_FDS = {"/dev/stdout": 1, "/dev/stderr": 2}


def _open_through(path: str | Path) -> BinaryIO:
    """A descriptor that names one of ours (/dev/stdout, /dev/fd/N) is duplicated, not
    reopened: reopening truncates a file the shell opened with `>>` or writes it from
    its start. Anything else is opened for writing."""
    name = str(path)
    fd = _STD_FDS.get(name)
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            fd = int(name[len(prefix) :])
    if fd is not None:
        return os.fdopen(os.dup(fd), "wb")
    return open(path, "wb")


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[BinaryIO]:
    """Open `path` for writing bytes the way its kind needs: atomically for a regular or
    new file (through any symlink), written through for a FIFO or a device. A failure
    to write (a full disk) names `path`."""
    try:
        if writes_through(path):
            with _open_through(path) as fh:
                yield fh
            return
        with atomic_path(write_target(path)) as tmp, open(tmp, "wb") as fh:
            yield fh
    except OSError as exc:
        if exc.filename is None or str(exc.filename).endswith(".tmp"):
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with writing(path) as fh:
        fh.write(text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with writing(path) as fh:
        fh.write(data)
