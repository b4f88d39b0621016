"""What training on a CPU takes from the CPU backend's compiled module: dropout's masks,
the loss's sweep over the logits, and attention.

All three have references in the core made of PyTorch operations (core/dropout.py,
core/losses.py, core/attention.py) that cost more than their arithmetic on a CPU (each
one's share of a bf16 update on the Multi30k recipe's model: BENCHMARKS.md, "The
training loop around the update"). The reference mask is four operations, one of them
PyTorch's CPU `random_`, which runs its generator serially. The compiled
`scaled_keep_mask` (csrc/dropout_mask.cpp) makes the same mask in one pass from a
counter-based generator, seeded from PyTorch's default generator, so a run's masks still
follow its seed and a resumed run repeats them bit for bit. The reference loss sweep is
a dozen operations over each 64 rows of logits; the compiled `smoothed_loss_sweep`
(csrc/smoothed_loss.cpp) reads each row twice and writes its gradient once. The
reference attention is a dozen operations forward and as many backward over score
matrices of a few hundred elements per head; the compiled one (csrc/attention_train.cpp)
takes a sentence at a time, all its heads' scores, softmax and weighted sums and their
gradients over float32 rows in cache, and writes the context with its heads already
merged.
All are built with the decoding kernels (one module, one build, one cache); where the
module cannot be built, training keeps the references and says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from nmt_cli.backends.cpu.build import CompileError, is_built, prepare_kernel
from nmt_cli.backends.plan import Implementation, Target
from nmt_cli.core.attention import Attention, attention
from nmt_cli.core.dropout import KeepMask
from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep


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


def compiled_attention(kernel: ModuleType) -> Attention:
    """The module's attention for float32 and bfloat16 CPU heads with a padding mask (one
    flag per key) or none, without attention dropout, in eager mode; the reference for
    anything else (a band mask, dropout, a graph being compiled, which traces it)."""

    def attend(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        b, s = k.size(0), k.size(2)
        fits = (
            dropout_p == 0.0
            and not torch.compiler.is_compiling()
            and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.bfloat16)
            and q.dtype == k.dtype == v.dtype
            and q.size(-1) == v.size(-1)
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
            and (mask is None or (mask.dtype == torch.bool and mask.shape == (b, 1, 1, s)))
        )
        if not fits:
            return attention(q, k, v, mask, causal, dropout_p)
        keys = None if mask is None else mask.reshape(b, s)
        out: Tensor = _CompiledAttention.apply(q, k, v, keys, causal, kernel)
        return out

    return attend


def training_kernel(
    on_compile: Callable[[str], None] | None = None, build: bool = True
) -> tuple[ModuleType | None, str]:
    """The compiled module (built first if need be: `on_compile` is told how far the
    build has come, None: on stderr), or None and the reason it could not be had.
    `build=False` takes only a module built already: `train()` builds it once, and the
    layout probe and the ranks after it do not try again where that failed (a failing
    build can take a minute)."""
    try:
        if not build and not is_built():
            return None, "the compiled module is not built"
        return prepare_kernel(on_compile), ""
    except (CompileError, OSError) as exc:
        return None, str(exc)


def implementations() -> list[Implementation]:
    """What the module does for training on a CPU: attention, dropout's masks and the
    loss's sweep (each tested against its reference in core)."""

    def refuses(target: Target) -> str | None:
        return None if target.kernel is not None else target.no_kernel

    def kernel(target: Target) -> ModuleType:
        assert target.kernel is not None
        return target.kernel

    return [
        Implementation(
            "attention",
            "the module's kernel (padding masks; the reference for others)",
            refuses,
            lambda target: compiled_attention(kernel(target)),
            "cpu",
            training=True,
        ),
        Implementation(
            "keep_mask",
            "the module's counter-based generator",
            refuses,
            lambda target: compiled_keep_mask(kernel(target)),
            "cpu",
            training=True,
        ),
        Implementation(
            "loss_sweep",
            "the module's sweep",
            refuses,
            lambda target: compiled_loss_sweep(kernel(target)),
            "cpu",
            training=True,
        ),
    ]
