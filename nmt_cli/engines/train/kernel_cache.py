"""Room in oneDNN's kernel cache for every batch shape of an epoch.

On CPUs, bf16 matrix products run through oneDNN, which builds a "primitive" (a kernel
compiled for one problem shape and thread count) the first time it meets a shape and
keeps it in an LRU cache of 1,024 primitives by default. Training cycles through the
same batch shapes every epoch (the plan is length-grouped: Multi30k's recipe has 116
shapes an epoch, and about 33 distinct products per shape between the forward, both
products of each backward, and attention), so an epoch needs about 3,800 primitives.
An LRU cache a quarter that size, walked in a cycle, evicts each primitive before its
shape comes back, so every update rebuilds kernels, epoch after epoch (BENCHMARKS.md,
"The training loop around the update"). With room for all of them, the second epoch
builds none.

oneDNN reads the capacity once, from ONEDNN_PRIMITIVE_CACHE_CAPACITY, when it builds
its first primitive; PyTorch offers no call to change it later. So training sets it
before its first product (the layout probe's) and before it spawns ranks, which inherit
it. A capacity the user set stays; a process that has already built primitives keeps
the cache it has.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CAPACITY_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# Four times what the Multi30k recipe's epoch needs: room for the kernels of both thread
# counts the thread tuner tries, and for corpora with more batch shapes, at no measurable
# cost in peak memory (BENCHMARKS.md).
TRAINING_CAPACITY = 16384


def widen_kernel_cache(
    environ: MutableMapping[str, str] = os.environ, capacity: int = TRAINING_CAPACITY
) -> None:
    """Ask oneDNN for room for `capacity` primitives, unless the user chose a size."""
    environ.setdefault(CAPACITY_VARIABLE, str(capacity))
