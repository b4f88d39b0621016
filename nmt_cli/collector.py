"""Python's cyclic garbage collector kept out of a command's start-up.

Importing PyTorch and loading a model create a few hundred thousand long-lived objects
(modules, functions, tensors' wrappers) in one burst. The collector counts allocations,
so that burst sets off one collection after another, and every full one walks all the
objects made so far, though those objects live as long as the process and there is
nothing to find. While a command starts up, the collector is paused; when it ends, what
exists is moved out of the collector's reach (`gc.freeze`: later collections, and forked
children's, never walk it again) and the collector runs as before for what the work
itself allocates (BENCHMARKS.md: `nmt translate` 0.2 s sooner on a Sapphire Rapids).
Python's documentation recommends the same sequence for processes that fork.

At exit everything is handed back to the collector (`gc.unfreeze`), so that its last
collection frees what start-up left in cycles, as it would have: freezing through the
exit saved another 0.25 s, but extensions that count their objects as the interpreter
ends (nanobind's, as in Triton, which CUDA builds of PyTorch load) then report the
objects it did not free as leaks, on every command's stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off inside (as the caller had it, after); what exists on the way
    out frozen until the program exits, whether the block ended or raised."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        atexit.register(gc.unfreeze)
        if enabled:
            gc.enable()
