"""Freed memory handed back to the system after each chunk of `nmt translate` (CPUs).

glibc's malloc returns only the top of each heap to the system; what a chunk's beams and
caches freed elsewhere stays resident, fragmented across the arenas of the decoding
threads. `release_free_memory` (malloc_trim) hands whole free pages back. The first call
after a 2,000-line chunk took ~150 ms and later ones 1-2 ms, so the translate command
calls it after a chunk at most once a second (`Releaser`): every chunk of a file, and no
more than a 1-2 ms toll a second on a line-at-a-time user.

Capping oneDNN's and ideep's kernel caches (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`,
`LRU_CACHE_CAPACITY`, 1024 entries each by default) was tried too: it bounds the memory
of bf16 products of ever new shapes, but the decoder now makes few (float32 attention,
bucketed batch sizes, source widths in steps of 8), and at 64 entries `nmt translate`
peaked ~100 MB higher on 20,000 and 29,000 lines, kernels evicted and rebuilt. The
environment variables still work for a user who wants a cap.
"""

from __future__ import annotations

import ctypes
import functools
import math
import time
from collections.abc import Callable
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
