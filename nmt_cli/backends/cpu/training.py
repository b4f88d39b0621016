"""What training on a CPU takes from the CPU backend's compiled module: dropout's masks
and residual add, the loss's sweep over the logits, attention, and the feed-forward's
bias and ReLU.

Each has a reference in the core made of PyTorch operations (core/dropout.py,
core/losses.py, core/attention.py, core/step_linear.py) that costs more than its
arithmetic on a CPU (the first three's share of a bf16 update on the Multi30k recipe's
model: BENCHMARKS.md, "The training loop around the update"). The reference mask is four
operations, one of them PyTorch's CPU `random_`, which runs its generator serially. The
compiled `scaled_keep_mask` (csrc/dropout_mask.cpp) makes the same mask in one pass from
a counter-based generator, seeded from PyTorch's default generator, so a run's masks
still follow its seed and a resumed run repeats them bit for bit; its `dropout_add`
draws the same masks a tile at a time as it adds, and again in the backward pass, so
that none is stored, and it adds the bias of the linear layer before it (which then
leaves it out of its product) and sums that bias's gradient backward. The reference
loss sweep is a dozen operations over each 64 rows of logits; the compiled
`smoothed_loss_sweep` (csrc/smoothed_loss.cpp) reads each row twice and writes its
gradient once. The reference attention is a dozen operations forward and
as many backward over score matrices of a few hundred elements per head; the compiled
one (csrc/attention_train.cpp) takes a sentence at a time, all its heads' scores,
softmax and weighted sums and their gradients over float32 rows in cache, and writes the
context with its heads already merged; as `biased_attention` it also adds the q, k and v
projections' biases as it reads them and sums their gradients. The reference
feed-forward layer copies its bias
into the product's output, ReLU writes a second tensor, and backward reads the gradient
twice (the mask, the bias's sums); the compiled `dense_relu` (csrc/bias_relu.cpp) takes
PyTorch's product without the bias and adds it with the ReLU in one pass, and backward
masks the gradient and sums it for the bias in another.
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
from nmt_cli.backends.plan import Implementation, Target
from nmt_cli.core.attention import Attention, BiasedAttention, attention, biased_attention
from nmt_cli.core.dropout import DropoutAdd, KeepMask, masked_dropout_add
from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep
from nmt_cli.core.step_linear import DenseReLU, dense_relu


def compiled_keep_mask(kernel: ModuleType) -> KeepMask:
    """The module's mask, one seed drawn from the default generator per mask."""

    def keep_mask(like: Tensor, p: float) -> Tensor:
        mask: Tensor = kernel.scaled_keep_mask(like, p, _mask_seed())
        return mask

    return keep_mask


def _mask_seed() -> int:
    """A mask's seed: 63 random bits from the default generator, so that
    `torch.manual_seed` reproduces the masks."""
    return int(torch.empty((), dtype=torch.int64).random_())


class _DropoutAdd(torch.autograd.Function):
    """residual + (x + bias) * mask with the module's mask drawn as it adds, and drawn
    again from its seed in the backward pass: the mask is never stored. With a bias, the
    backward pass sums the bias's gradient as it writes x's."""

    @staticmethod
    def forward(
        ctx: Any, residual: Tensor, x: Tensor, bias: Tensor | None, p: float, kernel: ModuleType
    ) -> Tensor:
        seed = _mask_seed()
        ctx.p, ctx.seed, ctx.kernel, ctx.biased = p, seed, kernel, bias is not None
        ctx.dtypes = residual.dtype, x.dtype
        out: Tensor = kernel.dropout_add(residual.contiguous(), x.contiguous(), p, seed, bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        residual_dtype, x_dtype = ctx.dtypes
        if not ctx.biased:
            grad_x = ctx.kernel.dropout_grad(grad, ctx.p, ctx.seed, x_dtype)
            return grad.to(residual_dtype), grad_x, None, None, None
        columns = grad.size(-1)
        grad_x, grad_bias = ctx.kernel.dropout_grad_summed(grad, ctx.p, ctx.seed, x_dtype, columns)
        return grad.to(residual_dtype), grad_x, grad_bias, None, None


def compiled_dropout_add(kernel: ModuleType) -> DropoutAdd:
    """The module's residual add with its mask drawn in place, for float32 and bfloat16
    CPU tensors of one shape and a float32 bias or none; the module's stored mask for
    anything else. The mask is the one `compiled_keep_mask` draws from the same generator
    state, bit for bit."""
    stored = compiled_keep_mask(kernel)

    def add(residual: Tensor, x: Tensor, p: float, bias: Tensor | None) -> Tensor:
        fits = (
            residual.device.type == x.device.type == "cpu"
            and residual.dtype in (torch.float32, torch.bfloat16)
            and x.dtype in (torch.float32, torch.bfloat16)
            and residual.shape == x.shape
            and (
                bias is None
                or (
                    bias.device.type == "cpu"
                    and bias.dtype == torch.float32
                    and bias.shape == x.shape[-1:]
                    and bias.is_contiguous()
                )
            )
        )
        if not fits:
            return masked_dropout_add(residual, x, p, stored, bias)
        out: Tensor = _DropoutAdd.apply(residual, x, bias, p, kernel)
        return out

    return add


def compiled_loss_sweep(kernel: ModuleType) -> LossSweep:
    """The module's sweep for float32 and bfloat16 CPU logits; the reference for others."""

    def sweep(
        logits: Tensor,
        target: Tensor,
        weight: Tensor,
        eps: float,
        want_grad: bool,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.bfloat16):
            return smoothed_loss_sweep(logits, target, weight, eps, want_grad, in_place)
        # In place over the logits, or over their contiguous copy, which is this call's.
        lse, mean, ref, grad = kernel.smoothed_loss_sweep(
            logits.contiguous(), target.contiguous(), weight.contiguous(), eps, want_grad, in_place
        )
        return lse, mean, ref, grad if want_grad else None

    return sweep


@dataclass(frozen=True)
class _Heads:
    """Where q, k and v lie in the tensors an attention's projections wrote: `groups`
    says how many of them (in the order q, k, v) each tensor holds side by side in its
    rows, the layout of a fused projection's output (self-attention: one tensor of all
    three; cross-attention: the queries', then one of the keys' and values'; none: q, k
    and v are tensors of their own)."""

    sentences: int
    heads: int
    width: int  # d, the same for q, k and v
    groups: tuple[int, ...]

    def split(self, sources: tuple[Tensor, ...]) -> list[Tensor]:
        """q, k and v, (B, h, n, d) views of `sources` (or of their gradients); with no
        groups, `sources` are q, k and v themselves."""
        if not self.groups:
            return list(sources)
        views = []
        for source, count in zip(sources, self.groups, strict=True):
            rows = source.view(self.sentences, -1, count * self.heads * self.width)
            for part in rows.chunk(count, dim=-1):
                n = rows.size(1)
                views.append(part.view(self.sentences, n, self.heads, self.width).transpose(1, 2))
        return views


def _heads_layout(q: Tensor, k: Tensor, v: Tensor) -> tuple[_Heads, tuple[Tensor, ...]]:
    """How q, k and v lie in the projections' outputs they are views of, and those
    outputs; where they are not such views, q, k and v themselves, each as it is."""
    b, h, length, d = q.shape
    keys = k.size(2)
    as_they_are = _Heads(b, h, d, ()), (q, k, v)
    groups: tuple[int, ...]
    sources: tuple[Tensor, ...]
    sizes: tuple[int, ...]
    if q._base is not None and q._base is k._base is v._base and length == keys:
        groups, sources, sizes = (3,), (q._base,), (b * length * 3 * h * d,)
    elif q._base is not None and k._base is not None and k._base is v._base:
        groups, sources = (1, 2), (q._base, k._base)
        sizes = (b * length * h * d, b * keys * 2 * h * d)
    else:
        return as_they_are
    if any(not t.is_contiguous() or t.numel() != n for t, n in zip(sources, sizes, strict=True)):
        return as_they_are
    layout = _Heads(b, h, d, groups)
    found = layout.split(sources)
    if all(
        f.shape == x.shape and f.stride() == x.stride() and f.data_ptr() == x.data_ptr()
        for f, x in zip(found, (q, k, v), strict=True)
    ):
        return layout, sources
    return as_they_are


class _CompiledAttention(torch.autograd.Function):
    """The module's attention forward and backward on the projections' outputs that q, k
    and v are heads of (`_Heads`): backward writes each output's gradient whole, where
    three separate gradients would be concatenated by autograd's split. The forward pass
    keeps the float32 weights for the backward pass, as the reference keeps its softmax.
    With `bias` (BiasedAttention's, float32), the kernel adds each head's part as it reads
    q, k and v, and sums its gradient as it writes theirs."""

    @staticmethod
    def forward(
        ctx: Any,
        layout: _Heads,
        key_mask: Tensor | None,
        causal: bool,
        kernel: ModuleType,
        bias: Tensor | None,
        *sources: Tensor,
    ) -> Tensor:
        q, k, v = layout.split(sources)
        scale = 1.0 / math.sqrt(q.size(-1))
        want = any(ctx.needs_input_grad[4:])
        heads = None if bias is None else bias.detach().view(3, q.size(1), q.size(-1))
        out, probs = kernel.attention_train_forward(
            q, k, v, key_mask, causal, scale, want, True, heads
        )
        if want:
            ctx.save_for_backward(*sources, probs)
            ctx.layout, ctx.scale, ctx.causal, ctx.kernel = layout, scale, causal, kernel
            ctx.heads = heads
        result: Tensor = out
        return result

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        *sources, probs = ctx.saved_tensors
        grads = tuple(torch.empty_like(s) for s in sources)
        q, k, v = ctx.layout.split(tuple(sources))
        dq, dk, dv = ctx.layout.split(grads)
        bias_grad = ctx.kernel.attention_train_backward_into(
            grad_out, q, k, v, probs, ctx.scale, ctx.causal, True, dq, dk, dv, ctx.heads
        )
        if bias_grad is not None:
            bias_grad = bias_grad.view(-1)
        return (None, None, None, None, bias_grad, *grads)


def _attention_fits(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> bool:
    """Whether the module's attention takes these heads: float32 or bfloat16 CPU heads of
    one width, a padding mask (one flag per key) or none, no attention dropout, eager."""
    b, s = k.size(0), k.size(2)
    return (
        dropout_p == 0.0
        and not torch.compiler.is_compiling()
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k.dtype == v.dtype
        and q.size(-1) == v.size(-1)
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and (mask is None or (mask.dtype == torch.bool and mask.shape == (b, 1, 1, s)))
    )


def _compiled_attend(
    kernel: ModuleType,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    causal: bool,
) -> Tensor:
    b, s = k.size(0), k.size(2)
    keys = None if mask is None else mask.reshape(b, s)
    layout, sources = _heads_layout(q, k, v)
    out: Tensor = _CompiledAttention.apply(layout, keys, causal, kernel, bias, *sources)
    return out


def compiled_attention(kernel: ModuleType) -> Attention:
    """The module's attention where `_attention_fits`; the reference for anything else (a
    band mask, dropout, a graph being compiled, which traces it)."""

    def attend(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        if not _attention_fits(q, k, v, mask, dropout_p):
            return attention(q, k, v, mask, causal, dropout_p)
        return _compiled_attend(kernel, q, k, v, None, mask, causal)

    return attend


def compiled_biased_attention(kernel: ModuleType) -> BiasedAttention:
    """The module's attention adding the projections' float32 biases itself where
    `_attention_fits`; the reference for anything else."""

    def attend(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        if not (_attention_fits(q, k, v, mask, dropout_p) and bias.dtype == torch.float32):
            return biased_attention(q, k, v, bias, mask, causal, dropout_p)
        return _compiled_attend(kernel, q, k, v, bias, mask, causal)

    return attend


class _DenseReLU(torch.autograd.Function):
    """max(0, x W^T + b): PyTorch's product, then the module's bias and ReLU in place;
    backward, the module's mask and bias sums, then PyTorch's two products. The operands
    are cast to `dtype` (autocast's where it is on, as it casts a linear layer's) and kept
    cast for the backward pass as its products keep them."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, dtype: torch.dtype, kernel: ModuleType
    ) -> Tensor:
        rows, w = x.reshape(-1, x.size(-1)).to(dtype), weight.to(dtype)
        with torch.autocast("cpu", enabled=False):
            out = torch.mm(rows, w.t())
        kernel.bias_relu_(out, bias.float())
        ctx.save_for_backward(rows, w, out)
        ctx.kernel = kernel
        return out.view(*x.shape[:-1], out.size(-1))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rows, w, out = ctx.saved_tensors
        # The ReLU's gradient over the incoming one, which autograd hands this function
        # alone: no tensor of tokens x d_ff is made for it.
        incoming = grad.reshape(out.shape).to(out.dtype)
        g, bias_grad = ctx.kernel.relu_bias_backward(incoming, out, True)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(g, w).view(*grad.shape[:-1], w.size(1))
        if ctx.needs_input_grad[1]:
            dw = torch.mm(g.t(), rows)
        return dx, dw, bias_grad if ctx.needs_input_grad[2] else None, None, None


def compiled_dense_relu(kernel: ModuleType) -> DenseReLU:
    """The module's bias and ReLU around PyTorch's product for float32 and bfloat16 CPU
    layers with a bias, in eager mode; the reference for anything else."""

    def layer(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        fits = (
            bias is not None
            and not torch.compiler.is_compiling()
            and x.device.type == weight.device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16)
            and x.dim() >= 2
            and x.numel() > 0
        )
        if not fits:
            return dense_relu(x, weight, bias)
        out: Tensor = _DenseReLU.apply(x, weight, bias, dtype, kernel)
        return out

    return layer


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
    """What the module does for training on a CPU: attention, dropout's masks and its
    residual add, the loss's sweep and the feed-forward's bias and ReLU (each tested
    against its reference in core)."""

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
            "biased_attention",
            "the module's kernel, adding the projections' biases as it reads q, k and v",
            refuses,
            lambda target: compiled_biased_attention(kernel(target)),
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
            "dropout_add",
            "the module's, its mask drawn as it adds and again backward, never stored",
            refuses,
            lambda target: compiled_dropout_add(kernel(target)),
            "cpu",
            training=True,
        ),
        Implementation(
            "dense_relu",
            "the module's bias and ReLU around PyTorch's product",
            refuses,
            lambda target: compiled_dense_relu(kernel(target)),
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
