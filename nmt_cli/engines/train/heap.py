"""Keep freed memory for the next update instead of returning it to the system.

Every CPU update allocates the same working set again: activations, their gradients, the
logits of the loss's chunks, most of them megabytes. glibc's malloc serves blocks that
large with `mmap` and gives them back with `munmap` when freed (and trims the top of its
heap above 128 KiB), so each update maps the memory afresh, and the kernel zero-fills
every page of it on first touch: page faults in the forward and the backward, and a
`munmap` storm between updates. `reused_heap` tells glibc to serve every size from its
heap and keep what is freed (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD = the maximum)
for the duration of training; afterwards it restores both defaults and hands the free
pages back (malloc_trim), so decoding in the same process (`nmt run`) starts lean. The
heap stays at the largest update's working set meanwhile, which training reaches anyway.

Where the C library is not glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

from nmt_cli.cpu_decode.memory import c_library_function, release_free_memory

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
