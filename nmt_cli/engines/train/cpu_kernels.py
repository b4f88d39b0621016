"""What training on a CPU takes from the CPU backend's compiled module: dropout's masks
and the loss's sweep over the logits.

Both have references in the core made of PyTorch operations (core/dropout.py,
core/losses.py) that cost more than their arithmetic on a CPU. The reference mask is four
operations, one of them PyTorch's CPU `random_`, which runs its generator serially: on
the Multi30k recipe's model the masks took about 8% of a bf16 update. The compiled
`scaled_keep_mask` (csrc/dropout_mask.cpp) makes the same mask in one pass from a
counter-based generator, seeded from PyTorch's default generator, so a run's masks still
follow its seed and a resumed run repeats them bit for bit. The reference loss sweep is a
dozen operations over each 64 rows of logits, about a tenth of the same update; the
compiled `smoothed_loss_sweep` (csrc/smoothed_loss.cpp) reads each row twice and writes
its gradient once. Both are built with the decoding kernels (one module, one build, one
cache); where the module cannot be built, training keeps the references and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from nmt_cli.core.dropout import KeepMask, scaled_keep_mask
from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep
from nmt_cli.cpu_decode.build import CompileError, is_built, prepare_kernel


@dataclass(frozen=True)
class CpuKernels:
    """Dropout's masks (`Transformer.set_dropout_mask`) and the loss's sweep
    (`TrainingObjective`, the validator); by default the core's references."""

    keep_mask: KeepMask = scaled_keep_mask
    loss_sweep: LossSweep = smoothed_loss_sweep


def compiled_keep_mask(kernel: ModuleType) -> KeepMask:
    """The module's mask, one seed drawn from the default generator per mask."""

    def keep_mask(like: Tensor, p: float) -> Tensor:
        seed = torch.empty((), dtype=torch.int64).random_()  # 63 random bits
        mask: Tensor = kernel.scaled_keep_mask(like, p, int(seed))
        return mask

    return keep_mask


def compiled_loss_sweep(kernel: ModuleType) -> LossSweep:
    """The module's sweep for float32 and bfloat16 CPU logits; the reference for others."""

    def sweep(
        logits: Tensor, target: Tensor, weight: Tensor, eps: float, want_grad: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.bfloat16):
            return smoothed_loss_sweep(logits, target, weight, eps, want_grad)
        lse, mean, ref, grad = kernel.smoothed_loss_sweep(
            logits.contiguous(), target.contiguous(), weight.contiguous(), eps, want_grad
        )
        return lse, mean, ref, grad if want_grad else None

    return sweep


def cpu_kernels(
    on_compile: Callable[[], None] = lambda: None, build: bool = True
) -> tuple[CpuKernels, str | None]:
    """The compiled kernels (the module built first if need be: `on_compile` is called
    then), or the references and the reason the module could not be had. `build=False`
    takes only a module built already: `train()` builds it once, and the layout probe and
    the ranks after it do not try again where that failed (a failing build can take a
    minute)."""
    try:
        if not build and not is_built():
            return CpuKernels(), "the compiled module is not built"
        kernel = prepare_kernel(on_compile)
    except (CompileError, OSError) as exc:
        return CpuKernels(), str(exc)
    return CpuKernels(compiled_keep_mask(kernel), compiled_loss_sweep(kernel)), None
