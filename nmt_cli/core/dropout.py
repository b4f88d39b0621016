"""Dropout (section 5.4) with a cheaper mask on the CPU, and dropout fused with the residual.

On a CPU, `torch.nn.functional.dropout` draws one Bernoulli sample per element, and on a
small Transformer those random numbers are a visible share of a training step
(BENCHMARKS.md, "What made the small model fast"). Here one 64-bit random word gives
four 16-bit uniform numbers, each compared with round(p * 65536): the drop probability
is p to within 1/65536 (0.1 becomes 0.100006), the mask is drawn from the default
generator (so `torch.manual_seed` reproduces it), and only the scaled mask is kept for
the backward pass.

The mask comes from the model's plan (`Operations.keep_mask`): `scaled_keep_mask` here,
the reference; the CPU backend's compiled one-pass mask (backends/cpu/training.py), which
draws the same distribution from a counter-based generator and is tested against this
one; or None, PyTorch's own dropout, for a GPU, whose fused kernel is already fast.

`Dropout.add(residual, x)` computes `residual + dropout(x)`, the paper's
"dropout to the output of each sub-layer, before it is added to the sub-layer input",
in one pass instead of two; a backend may do it in one operation of its own
(`Operations.dropout_add`: the CPU backend's draws the mask as it adds and again in the
backward pass, so that it is never stored). `Dropout.add_linear(residual, layer, x)` is
the same add of `layer(x)`, where such an operation also takes the linear layer's bias,
so that the product is computed without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.core.step_linear import linear, linear_add


def seed_dropout(device: torch.device, seed: int) -> None:
    """Seed the generator `device`'s dropout masks come from, and only that one:
    `torch.manual_seed` also seeds every other backend's generators, host time on every
    micro-batch of a training run (BENCHMARKS.md, "The training loop around the update")."""
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device's generator
    elif device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


# (like, p) -> 0 with probability p, else 1 / (1 - p); the dtype and shape of `like`.
KeepMask = Callable[[Tensor, float], Tensor]

# (residual, x, p, bias) -> residual + dropout(x + bias) (bias None: + 0), differentiable:
# a backend's fused form. `bias` is the float32 bias of the linear layer whose product
# without it is x, added here instead of into the product's output.
DropoutAdd = Callable[[Tensor, Tensor, float, Tensor | None], Tensor]


def scaled_keep_mask(like: Tensor, p: float) -> Tensor:
    """The reference KeepMask: from the default generator, p to within 1/65536."""
    n = like.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device)
    words.random_(-(2**63), 2**63 - 1)
    threshold = round(p * 65536) - 32768  # int16 values are uniform on [-32768, 32767]
    keep = words.view(torch.int16)[:n].view(like.shape) >= threshold
    return keep.to(like.dtype).mul_(1.0 / (1.0 - p))


class _MaskedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float, keep_mask: KeepMask) -> Tensor:
        mask = keep_mask(x, p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None, None


class _MaskedDropoutAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, residual: Tensor, x: Tensor, p: float, keep_mask: KeepMask) -> Tensor:
        mask = keep_mask(x, p)
        ctx.save_for_backward(mask)
        ctx.residual_dtype = residual.dtype
        if residual.dtype == x.dtype:
            return torch.addcmul(residual, x, mask)
        return residual + x * mask

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return grad.to(ctx.residual_dtype), (grad * mask).to(mask.dtype), None, None


def masked_dropout_add(
    residual: Tensor, x: Tensor, p: float, keep_mask: KeepMask, bias: Tensor | None = None
) -> Tensor:
    """residual + (x + bias) * keep_mask(x + bias, p), the mask kept for the backward
    pass: the reference of a DropoutAdd."""
    biased = x if bias is None else x + bias
    out: Tensor = _MaskedDropoutAdd.apply(residual, biased, p, keep_mask)
    return out


class Dropout(nn.Dropout):
    """`nn.Dropout` with the cheaper CPU mask, plus `add` for dropout before a residual."""

    def __init__(
        self,
        p: float = 0.5,
        keep_mask: KeepMask | None = scaled_keep_mask,
        fused_add: DropoutAdd | None = None,
    ) -> None:
        super().__init__(p)
        self.keep_mask = keep_mask  # None: PyTorch's dropout (see the module's docstring)
        self.fused_add = fused_add  # None: `masked_dropout_add` with keep_mask

    def _fast(self, x: Tensor) -> bool:
        """The planned mask, in eager mode: torch.compile cannot trace its 16-bit view of
        64-bit words (a graph break at every dropout), so compiled graphs get PyTorch's."""
        planned = self.keep_mask is not None and not torch.compiler.is_compiling()
        return planned and math.prod(x.shape) > 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self._fast(x):
            out: Tensor = _MaskedDropout.apply(x, self.p, self.keep_mask)
            return out
        return F.dropout(x, self.p, True)

    def add(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + dropout(x)."""
        if not self.training or self.p == 0.0:
            return residual + x
        if self._fast(x):
            assert self.keep_mask is not None
            if self.fused_add is not None:
                return self.fused_add(residual, x, self.p, None)
            return masked_dropout_add(residual, x, self.p, self.keep_mask)
        return residual + F.dropout(x, self.p, True)

    def add_linear(self, residual: Tensor, layer: nn.Module, x: Tensor) -> Tensor:
        """residual + dropout(layer(x)). A fused add takes an `nn.Linear`'s bias itself
        where the product runs in the layer's dtype: the product's output is then written
        once, not first filled with the bias, and the bias's gradient is summed as the
        add's gradient is written, not in a pass of its own. Under autocast (bf16
        products) the product keeps its bias: there the fused add with the bias made the
        update slower, not faster (BENCHMARKS.md)."""
        takes_bias = (
            self.training
            and self.p > 0.0
            and self.fused_add is not None
            and not torch.is_autocast_enabled(x.device.type)
            and self._fast(x)
        )
        if takes_bias and isinstance(layer, nn.Linear) and layer.bias is not None:
            assert self.fused_add is not None
            return self.fused_add(residual, F.linear(x, layer.weight), self.p, layer.bias)
        if not self.training or self.p == 0.0:  # a decoding layer adds in its product
            return linear_add(layer, x, residual)
        return self.add(residual, linear(layer, x))
