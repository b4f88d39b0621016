"""Python's cyclic garbage collector kept out of a command's start-up and exit.

Importing PyTorch and loading a model create a few hundred thousand long-lived objects
(modules, functions, tensors' wrappers) in one burst. The collector counts allocations,
so that burst sets off one collection after another, and every full one walks all the
objects made so far, though those objects live as long as the process and there is
nothing to find. The interpreter's last collection, at exit, walks them all again.
While a command starts up, the collector is paused; when it ends, what exists is moved
out of the collector's reach for good (`gc.freeze`: later collections, the one at exit
and forked children's never walk it again) and the collector runs as before for what the
work itself allocates. `nmt translate` on an empty input took 1.7 s, now 1.25 on a
Sapphire Rapids (BENCHMARKS.md). The few cycles start-up may have left are kept: a
bounded, one-time cost. Python's documentation recommends the same sequence for
processes that fork.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off inside (as the caller had it, after); what exists on the way
    out frozen, whether the block ended or raised."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def skip_at_exit() -> None:
    """Freeze everything once the program is done (atexit), so that the interpreter's
    last collection walks none of it: 0.37 s to exit after importing PyTorch and nmt's
    decoding, 0.12 s frozen [Sapphire Rapids]. Objects still free by their reference
    counts as modules are torn down; only cycles left at exit go uncollected, whose
    memory the process returns as it ends."""
    atexit.register(gc.freeze)
