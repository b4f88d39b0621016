"""What training on a CPU takes from the CPU backend's compiled module: dropout's masks,
the loss's sweep over the logits, and attention.

All three have references in the core made of PyTorch operations (core/dropout.py,
core/losses.py, core/written_attention.py) that cost more than their arithmetic on a CPU.
The reference mask is four operations, one of them PyTorch's CPU `random_`, which runs
its generator serially: on the Multi30k recipe's model the masks took about 8% of a bf16
update. The compiled `scaled_keep_mask` (csrc/dropout_mask.cpp) makes the same mask in
one pass from a counter-based generator, seeded from PyTorch's default generator, so a
run's masks still follow its seed and a resumed run repeats them bit for bit. The
reference loss sweep is a dozen operations over each 64 rows of logits, about a tenth of
the same update; the compiled `smoothed_loss_sweep` (csrc/smoothed_loss.cpp) reads each
row twice and writes its gradient once. The reference attention is a dozen operations
forward and as many backward over score matrices of a few hundred elements per head,
about a seventh of the update; the compiled one (csrc/attention_train.cpp) takes a
sentence at a time, all its heads' scores, softmax and weighted sums and their gradients
over float32 rows in cache, and writes the context with its heads already merged.
All are built with the decoding kernels (one module, one build, one cache); where the
module cannot be built, training keeps the references and says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from nmt_cli.backends.cpu.build import CompileError, is_built, prepare_kernel
from nmt_cli.core.dropout import KeepMask, scaled_keep_mask
from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.written_attention import TrainingAttention, written_out_attention


@dataclass(frozen=True)
class CpuKernels:
    """Dropout's masks (`Transformer.set_dropout_mask`), the loss's sweep
    (`TrainingObjective`, the validator) and attention (`Transformer.set_cpu_attention`);
    by default the core's references."""

    keep_mask: KeepMask = scaled_keep_mask
    loss_sweep: LossSweep = smoothed_loss_sweep
    attention: TrainingAttention = written_out_attention

    def apply_to(self, model: Transformer) -> None:
        """The model's masks and attention from here (the loss's sweep is the objective's)."""
        model.set_dropout_mask(self.keep_mask)
        model.set_cpu_attention(self.attention)


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


class _CompiledAttention(torch.autograd.Function):
    """The module's attention forward and backward; the forward pass keeps the float32
    weights for the backward pass, as the reference keeps its softmax."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_mask: Tensor | None,
        causal: bool,
        kernel: ModuleType,
    ) -> Tensor:
        scale = 1.0 / math.sqrt(q.size(-1))
        want = any(ctx.needs_input_grad[:3])
        out, probs = kernel.attention_train_forward(q, k, v, key_mask, causal, scale, want, True)
        if want:
            ctx.save_for_backward(q, k, v, probs)
            ctx.scale, ctx.causal, ctx.kernel = scale, causal, kernel
        result: Tensor = out
        return result

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, probs = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.attention_train_backward(
            grad_out, q, k, v, probs, ctx.scale, ctx.causal, True
        )
        return dq, dk, dv, None, None, None


def compiled_attention(kernel: ModuleType) -> TrainingAttention:
    """The module's attention for float32 and bfloat16 CPU heads with a padding mask (one
    flag per key) or none; the reference for anything else (a band mask, say)."""

    def attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool) -> Tensor:
        b, s = k.size(0), k.size(2)
        fits = (
            q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.bfloat16)
            and q.dtype == k.dtype == v.dtype
            and q.size(-1) == v.size(-1)
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
            and (key_mask is None or key_mask.shape == (b, 1, 1, s))
        )
        if not fits:
            return written_out_attention(q, k, v, key_mask, causal)
        keys = None if key_mask is None else key_mask.reshape(b, s)
        out: Tensor = _CompiledAttention.apply(q, k, v, keys, causal, kernel)
        return out

    return attention


def cpu_kernels(
    on_compile: Callable[[str], None] | None = None, build: bool = True
) -> tuple[CpuKernels, str | None]:
    """The compiled kernels (the module built first if need be: `on_compile` is told how
    far the build has come, None: on stderr), or the references and the reason the
    module could not be had. `build=False` takes only a module built already: `train()`
    builds it once, and the layout probe and the ranks after it do not try again where
    that failed (a failing build can take a minute)."""
    try:
        if not build and not is_built():
            return CpuKernels(), "the compiled module is not built"
        kernel = prepare_kernel(on_compile)
    except (CompileError, OSError) as exc:
        return CpuKernels(), str(exc)
    compiled = CpuKernels(
        compiled_keep_mask(kernel), compiled_loss_sweep(kernel), compiled_attention(kernel)
    )
    return compiled, None


def cpu_kernel_paths(kernel: ModuleType | None) -> dict[str, str]:
    """Which implementation each of training's CPU operations takes, in words (`nmt
    env`): the module's kernels where it is loaded, at the loops its CPU level allows."""
    if kernel is None:
        reference = "PyTorch's operations (core's reference; the module is not loaded)"
        return {"dropout masks": reference, "smoothed loss": reference, "attention": reference}
    vectorized = kernel.vectorized()

    def loops(name: str) -> str:
        return "AVX-512 loops" if vectorized[name] else "plain loops"

    return {
        "dropout masks": "the module's counter-based generator",
        "smoothed loss": f"the module's sweep, {loops('smoothed_loss')}",
        "attention": (
            f"the module's, {loops('attention_train')} (padding masks; PyTorch's otherwise)"
        ),
    }
