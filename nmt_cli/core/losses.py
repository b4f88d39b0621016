"""Label-smoothed cross-entropy (section 5.4), fused into one pass over the logits.

The smoothed target puts 1 - eps on the reference token and spreads eps uniformly over
the whole vocabulary, so per token

    loss = (1 - eps) * nll + eps * mean_v(-log p_v),   nll = -log p_ref,

and with lse = logsumexp(z): nll = lse - z_ref and mean_v(-log p_v) = lse - mean(z).
Written this way nothing of size V is kept but the gradient; the backward pass is
softmax(z) - (1 - eps) * onehot - eps / V, computed in the same sweep as the loss instead
of autograd's chain through log_softmax, gather and mean (the log-softmax over the
vocabulary is one of the most expensive parts of a small model's step on a CPU).

Two entry points share that sweep: `label_smoothed_sums` takes logits (CPUs, validation);
`projected_label_smoothed_sums` takes the decoder's hidden states and the tied output
projection (section 3.4) and runs projection, loss and both gradients a chunk of tokens
at a time, so that on a GPU the (tokens x V) logits, their fp32 copies and their gradient
are never stored whole (unfused, the loss is a large share of a base step's GPU time:
BENCHMARKS.md, "GPU").
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

_CHUNK_ROWS = 64  # CPU: rows of logits processed together; 64 x 8k fp32 stays in L2 cache
_GPU_CHUNK_ELEMENTS = 1 << 26  # GPU: few large chunks (kernel launches are the cost there)


def _chunk_rows(logits: Tensor) -> int:
    return _rows_per_chunk(logits.device.type, logits.size(-1))


def _rows_per_chunk(device_type: str, vocab: int) -> int:
    if device_type == "cpu":
        return _CHUNK_ROWS
    return max(_CHUNK_ROWS, _GPU_CHUNK_ELEMENTS // max(1, vocab))


def _sweep(
    z_in: Tensor, target: Tensor, eps: float, mask: Tensor | None, want_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One chunk of logit rows: (logsumexp, mean logit, gradient or None), all in fp32.

    One exp per element, shared by the loss and the softmax, on a private fp32 copy
    (changed in place): the gradient is softmax - eps / V - (1 - eps) * onehot(target),
    zero where `mask` is 0.
    """
    vocab = z_in.size(-1)
    z = z_in.to(torch.float32, copy=True)
    mean = z.mean(-1)
    top = z.amax(-1, keepdim=True)
    e = z.sub_(top).exp_()
    total = e.sum(-1, keepdim=True)
    lse = (top + total.log()).squeeze(-1)
    if not want_grad:
        return lse, mean, None
    e.div_(total).sub_(eps / vocab)
    rows = torch.arange(e.size(0), device=e.device)
    e[rows, target] -= 1.0 - eps
    if mask is not None:
        e.mul_(mask[:, None])
    return lse, mean, e


class LossSweep(Protocol):
    """(logits (N, V), targets (N), token weights (N), eps, want_grad) -> per row
    logsumexp, mean logit and target logit (fp32) and, when asked, the gradient of the
    weighted smoothed loss with respect to the logits, in their dtype; `in_place` writes
    that gradient over the logits (contiguous ones), for a caller that reads them no
    more. `smoothed_loss_sweep` is the reference; training on a CPU passes the compiled
    module's (backends/cpu/training.py)."""

    def __call__(
        self,
        logits: Tensor,
        target: Tensor,
        weight: Tensor,
        eps: float,
        want_grad: bool,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]: ...


def smoothed_loss_sweep(
    logits: Tensor,
    target: Tensor,
    weight: Tensor,
    eps: float,
    want_grad: bool,
    in_place: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The reference sweep: a few rows at a time, each chunk in cache while PyTorch's
    operations pass over it (in place, a chunk's gradient is written after it is read)."""
    n = logits.size(0)
    z_ref = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()
    in_place = in_place and logits.is_contiguous()
    grad = (logits if in_place else torch.empty_like(logits)) if want_grad else None
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    mean = torch.empty_like(lse)
    chunk = _chunk_rows(logits)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        lse[lo:hi], mean[lo:hi], e = _sweep(
            logits[lo:hi], target[lo:hi], eps, weight[lo:hi], want_grad
        )
        if grad is not None and e is not None:
            grad[lo:hi] = e
    return lse, mean, z_ref, grad


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Forward and gradient in one sweep over the logits.

    The gradient of the summed loss with respect to the logits does not depend on
    anything downstream but a scalar, so the forward pass computes it while each row of
    logits is in cache (one exp per element, shared by the loss and the softmax) and
    keeps it, in the logits' dtype, instead of the logits. The trainer knows that
    scalar before the forward pass (1 / the update's target tokens, times the
    micro-batch's weight) and says so (`grad_scale`): the sweep folds it into each row's
    weight, and the backward pass, given exactly that scalar, hands the gradient on
    untouched. Another scalar (a GradScaler's, or none said) costs one multiplication
    over the (tokens x V) gradient, in place. Without a gradient (validation) only the
    loss is computed.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        mask: Tensor,
        eps: float,
        sweep: LossSweep,
        grad_scale: float,
        in_place: bool,
    ) -> tuple[Tensor, Tensor]:
        want_grad = bool(ctx.needs_input_grad[0])
        weight = mask * grad_scale if want_grad and grad_scale != 1.0 else mask
        lse, mean, z_ref, grad = sweep(logits, target, weight, eps, want_grad, in_place)
        loss, nll = _smoothed_sums(lse, mean, z_ref, mask, eps)
        if grad is not None:
            ctx.save_for_backward(grad)
            ctx.grad_scale = grad_scale
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        # The scalar said in advance (read only on the CPU: a GPU would wait for it).
        if grad_loss.device.type == "cpu" and float(grad_loss) == ctx.grad_scale:
            return grad, None, None, None, None, None, None
        # In place: a (tokens x V) product written into fresh memory cost a page fault
        # every 4 KiB (BENCHMARKS.md, "the training update by operation"). The saved
        # gradient is spent; a second backward through this graph is refused by autograd
        # (the saved tensor changed), never given a scaled-twice gradient.
        return grad.mul_(grad_loss / ctx.grad_scale), None, None, None, None, None, None


def _smoothed_sums(
    lse: Tensor, mean: Tensor, z_ref: Tensor, mask: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, nll sum) from per-row logsumexp, mean logit and target logit."""
    nll = (lse - z_ref) * mask
    smooth = (lse - mean) * mask
    loss = (1.0 - eps) * nll + eps * smooth
    return loss.sum(), nll.sum().detach()


def label_smoothed_sums(
    logits: Tensor,
    target: Tensor,
    eps: float,
    pad_id: int,
    sweep: LossSweep = smoothed_loss_sweep,
    grad_scale: float = 1.0,
    spend_logits: bool = False,
) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, nll sum) over non-padding tokens, without a host sync.

    The trainer knows its token counts from the batch, so it uses this form and never
    waits for the device to count the mask. `grad_scale`: what the loss sum will be
    multiplied by before its backward pass, if known (any value is correct; the one
    that is used saves a pass over the gradient). `spend_logits`: the caller reads the
    logits no more, so their gradient is written over them; a tensor of their size
    (tokens x V) is not made, nor filled through the caches.
    """
    flat_logits = logits.reshape(-1, logits.size(-1))
    flat_target = target.reshape(-1)
    mask = (flat_target != pad_id).to(torch.float32)
    # In float32, as the trainer's `loss * scale` hands it to the backward pass.
    scale32 = torch.tensor(grad_scale, dtype=torch.float32).item()
    loss, nll = _SmoothedCrossEntropy.apply(
        flat_logits, flat_target, mask, float(eps), sweep, scale32, spend_logits
    )
    return loss, nll


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output projection, the loss and both their gradients, a chunk of tokens at a
    time: the (tokens x V) logits exist one chunk at a time and are never stored.

    Per chunk: logits = h W^T, the sweep above (loss terms and the logits' gradient G,
    rounded to the logits' dtype as the unfused path stores it), then G W and G^T h,
    the gradients of the hidden states and of the tied embedding matrix (section 3.4).
    Only those two, of size (tokens x D) and (V x D), wait for the backward pass, which
    scales them by the incoming scalar. Only real tokens are projected: `rows` lists
    them, and padding rows get zero loss and zero gradient as in the unfused path.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        mask: Tensor,
        rows: Tensor,
        eps: float,
        dtype: torch.dtype,
        chunk: int,
    ) -> tuple[Tensor, Tensor]:
        want_grad = bool(ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        n = hidden.size(0)
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.index_select(0, rows).to(dtype)
            w = weight.to(dtype)  # once, not once per chunk
            t = target.index_select(0, rows)
            real = h.size(0)
            lse = torch.zeros(n, dtype=torch.float32, device=hidden.device)
            mean, z_ref = torch.zeros_like(lse), torch.zeros_like(lse)
            part_lse, part_mean, part_ref = (
                torch.empty(real, dtype=lse.dtype, device=lse.device) for _ in range(3)
            )
            grad_h = torch.empty_like(h) if want_grad else None
            grad_w: Tensor | None = None
            for lo in range(0, real, chunk):
                hi = min(real, lo + chunk)
                z = F.linear(h[lo:hi], w)
                part_ref[lo:hi] = z.gather(-1, t[lo:hi, None]).squeeze(-1).float()
                part_lse[lo:hi], part_mean[lo:hi], e = _sweep(z, t[lo:hi], eps, None, want_grad)
                if grad_h is not None and e is not None:
                    g = z.copy_(e)  # the logits' dtype, as the unfused path keeps its gradient
                    grad_h[lo:hi] = g.mm(w)
                    part = g.t().mm(h[lo:hi]).float()
                    grad_w = part if grad_w is None else grad_w.add_(part)
            lse.index_copy_(0, rows, part_lse)
            mean.index_copy_(0, rows, part_mean)
            z_ref.index_copy_(0, rows, part_ref)
            loss, nll = _smoothed_sums(lse, mean, z_ref, mask, eps)
        if grad_h is not None:
            if grad_w is None:  # no real token: nothing flows back
                grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            ctx.save_for_backward(grad_h, grad_w, rows)
            ctx.shapes = (hidden.shape, hidden.dtype, weight.dtype)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w, rows = ctx.saved_tensors
        hidden_shape, hidden_dtype, weight_dtype = ctx.shapes
        d_hidden = torch.zeros(hidden_shape, dtype=hidden_dtype, device=grad_h.device)
        d_hidden.index_copy_(0, rows, (grad_h * grad_loss).to(hidden_dtype))
        d_weight = (grad_w * grad_loss).to(weight_dtype)
        return d_hidden, d_weight, None, None, None, None, None, None


def projected_label_smoothed_sums(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    pad_id: int,
    tokens: int | None = None,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """`label_smoothed_sums(F.linear(hidden, weight), target, ...)` without the logits.

    hidden (..., D), weight (V, D), target (...). `tokens`, the number of non-padding
    targets, comes from the batch; without it the mask is counted on the device (a host
    sync). The logits are computed in autocast's dtype when autocast is on, as `F.linear`
    would. On a GPU the chunks are large (the kernels' launches are the cost there); on a
    CPU they are 64 rows and the unfused form is faster (its logits stay in cache).
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    flat_target = target.reshape(-1)
    is_pad = flat_target == pad_id
    mask = (~is_pad).to(torch.float32)
    if tokens is None:
        tokens = int(mask.sum().item())
    # Real positions first, in order; a stable sort needs no host sync, unlike nonzero().
    rows = torch.argsort(is_pad.to(torch.uint8), stable=True)[:tokens]
    device = hidden.device.type
    dtype = (
        torch.get_autocast_dtype(device)
        if torch.is_autocast_enabled(device)
        else torch.promote_types(hidden.dtype, weight.dtype)
    )
    chunk = chunk_rows or _rows_per_chunk(device, weight.size(0))
    loss, nll = _ProjectedSmoothedCrossEntropy.apply(
        flat_hidden, weight, flat_target, mask, rows, float(eps), dtype, chunk
    )
    return loss, nll
