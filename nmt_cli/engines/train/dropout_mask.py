"""Training's dropout masks on a CPU from the CPU backend's compiled module.

The reference mask (core/dropout.py) costs four PyTorch operations, one of them PyTorch's
CPU `random_`, which runs its generator serially: on the Multi30k recipe's model the
masks took about 8% of a bf16 update. The compiled `scaled_keep_mask` (csrc/dropout_mask.cpp,
built with the decoding kernels: one module, one build, one cache) makes the same mask in
one pass from a counter-based generator, seeded from PyTorch's default generator, so a
run's masks still follow its seed and a resumed run repeats them bit for bit. Where the
module cannot be built, training keeps the reference and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from nmt_cli.core.dropout import KeepMask, scaled_keep_mask
from nmt_cli.cpu_decode.build import CompileError, is_built, prepare_kernel


def compiled_keep_mask(kernel: ModuleType) -> KeepMask:
    """The module's mask, one seed drawn from the default generator per mask."""

    def keep_mask(like: torch.Tensor, p: float) -> torch.Tensor:
        seed = torch.empty((), dtype=torch.int64).random_()  # 63 random bits
        mask: torch.Tensor = kernel.scaled_keep_mask(like, p, int(seed))
        return mask

    return keep_mask


def cpu_keep_mask(
    on_compile: Callable[[], None] = lambda: None, build: bool = True
) -> tuple[KeepMask, str | None]:
    """The compiled mask (built first if need be: `on_compile` is called then), or the
    reference and the reason the module could not be had. `build=False` takes only a
    module built already: `train()` builds it once, and the layout probe and the ranks
    after it do not try again where that failed (a failing build can take a minute)."""
    try:
        if not build and not is_built():
            return scaled_keep_mask, "the compiled module is not built"
        return compiled_keep_mask(prepare_kernel(on_compile)), None
    except (CompileError, OSError) as exc:
        return scaled_keep_mask, str(exc)
