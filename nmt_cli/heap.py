"""glibc's heap, told what nmt's two workloads need of it.

Decoding a file (`nmt translate`, CPUs) frees a chunk's beams and caches across the
arenas of the decoding threads, and malloc returns only the top of each heap to the
system: `Releaser` hands whole free pages back (malloc_trim) after a chunk, at most
once a second. A call is slow after a large chunk and cheap after a small one
(BENCHMARKS.md), so every chunk of a file gets one, and a program sending one line at a
time pays at most one small toll a second.

Training is the opposite: every update allocates the same working set again, megabytes
of activations and gradients that malloc serves with `mmap` and unmaps when freed, so
each update would page-fault its memory afresh. `reused_heap` tells glibc to serve every
size from its heap and keep what is freed (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD =
the maximum) for the duration of training; afterwards it restores both defaults and
hands the free pages back, so decoding in the same process (`nmt run`) starts lean.

Where the C library is not glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@functools.cache
def c_library_function(name: str) -> Any:
    """A C library function from the symbols already loaded (no library search, which
    would start a subprocess), or None where the C library has no such function."""
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return None
    return getattr(process, name, None)


def release_free_memory() -> bool:
    """Return the free pages glibc's malloc holds to the system (malloc_trim); False
    where the C library has no malloc_trim (macOS), which keeps what it keeps."""
    trim = c_library_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


@dataclass
class Releaser:
    """`release_free_memory` after a chunk of work, at most once every `interval_s`."""

    interval_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    release: Callable[[], bool] = release_free_memory
    last: float = -math.inf  # clock reading of the last release

    def after_chunk(self) -> bool:
        """Release now unless the last release was under `interval_s` ago; True if it ran."""
        now = self.clock()
        if now - self.last < self.interval_s:
            return False
        self.last = now
        self.release()
        return True


_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

# glibc's defaults (malloc/malloc.c): trim above 128 KiB, up to 65,536 mappings
_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}
_KEEP = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 2**31 - 1}


def _mallopt() -> Any:
    """glibc's mallopt, or None (another C library's need not take glibc's parameters)."""
    if c_library_function("gnu_get_libc_version") is None:
        return None
    function = c_library_function("mallopt")
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int]
        function.restype = ctypes.c_int
    return function


@contextlib.contextmanager
def reused_heap() -> Iterator[bool]:
    """Within the block, freed memory stays in the process for reuse; yields whether the
    C library took the setting."""
    mallopt = _mallopt()
    taken = mallopt is not None and all(mallopt(k, v) == 1 for k, v in _KEEP.items())
    try:
        yield taken
    finally:
        if mallopt is not None:
            for key, value in _DEFAULTS.items():
                mallopt(key, value)
            release_free_memory()
