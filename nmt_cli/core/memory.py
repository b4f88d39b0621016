"""Resident memory of a long decoding run that does not grow with its input (CPUs).

`nmt translate` in bf16 on a CPU grew from 1.06 GiB after 2,000 Multi30k training lines
to 1.7 GiB after 28,000, for a 30 MB model. Neither the model nor Python objects grew;
two native mechanisms did, and both are bounded here:

- Kernel caches. A bf16 matrix product runs as a oneDNN primitive, a kernel compiled
  for its exact shape, and two caches keep every primitive made: oneDNN's own
  (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) and ideep's, PyTorch's layer above it
  (`LRU_CACHE_CAPACITY`), 1024 entries each by default. Beam search makes new shapes
  all the time: self-attention's keys grow by one every step, so each (batch rows,
  prefix length) pair is a new kernel, thousands over a file, and both caches fill up
  to about 700 MB. The shapes a batch needs right now (its projections, its current
  step) are a few dozen, and these stay cached at `KERNEL_CACHE_ENTRIES`: decoding was
  as fast as with 1024 (batch 128 and batch 1), while no cache at all was 3x slower at
  batch 1. fp32 runs on MKL's BLAS and keeps no such cache.
- Freed memory that glibc's malloc keeps. Kernels evicted from a cache are freed, but
  glibc returns only the top of each heap to the system; the rest stays resident,
  fragmented across the arenas of the decoding threads, and grew by ~450 MB over the
  same input. `release_free_memory` (malloc_trim) hands whole free pages back. The
  first call after a 2,000-line chunk took ~150 ms and later ones 1-2 ms, so the
  translate command calls it after a chunk at most once a second (`Releaser`): every
  chunk of a file, and no more than a 1-2 ms toll a second on a line-at-a-time user.

The caches read their capacity once, when the first primitive is made, so
`bound_kernel_caches` must run before the process decodes anything; a capacity the user
set in the environment wins.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

# Entries of each kernel cache: the working set of a decoding step, many times over.
KERNEL_CACHE_ENTRIES = 64
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(
    entries: int = KERNEL_CACHE_ENTRIES, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Cap oneDNN's and ideep's kernel caches at `entries` each, unless the environment
    already sets them; returns the capacities now in force. Call before the first
    matrix product of the process (later calls change nothing in a running cache)."""
    env = os.environ if environ is None else environ
    for name in CACHE_VARIABLES:
        env.setdefault(name, str(entries))
    return {name: env[name] for name in CACHE_VARIABLES}


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the symbols already loaded (no library search, which
    would start a subprocess), or None."""
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return None
    return getattr(process, "malloc_trim", None)


def release_free_memory() -> bool:
    """Return the free pages glibc's malloc holds to the system (malloc_trim); False
    where the C library has no malloc_trim (macOS), which keeps what it keeps."""
    trim = _malloc_trim()
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
