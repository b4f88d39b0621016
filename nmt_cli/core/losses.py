"""Label-smoothed cross-entropy (section 5.4), fused into one pass over the logits.

The smoothed target puts 1 - eps on the reference token and spreads eps uniformly over
the whole vocabulary, so per token

    loss = (1 - eps) * nll + eps * mean_v(-log p_v),   nll = -log p_ref,

and with lse = logsumexp(z): nll = lse - z_ref and mean_v(-log p_v) = lse - mean(z).
Written this way nothing of size V is kept but the gradient; the backward pass is
softmax(z) - (1 - eps) * onehot - eps / V, computed in the same sweep as the loss instead
of autograd's chain through log_softmax, gather and mean (the log-softmax over the
vocabulary is one of the most expensive parts of a small model's step on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class LossOutput:
    """Sums over non-padding target tokens; divide by `tokens` for per-token figures."""

    loss: Tensor  # smoothed loss, differentiable
    nll: Tensor  # plain negative log-likelihood, for perplexity
    tokens: int


_CHUNK_ROWS = 64  # CPU: rows of logits processed together; 64 x 8k fp32 stays in L2 cache
_GPU_CHUNK_ELEMENTS = 1 << 26  # GPU: few large chunks (kernel launches are the cost there)


def _chunk_rows(logits: Tensor) -> int:
    if logits.device.type == "cpu":
        return _CHUNK_ROWS
    return max(_CHUNK_ROWS, _GPU_CHUNK_ELEMENTS // max(1, logits.size(-1)))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Forward and gradient in one sweep over the logits, a few rows at a time.

    The gradient of the summed loss with respect to the logits does not depend on
    anything downstream but a scalar, so the forward pass computes it while each chunk of
    logits is in cache (one exp per element, shared by the loss and the softmax) and
    keeps it, in the logits' dtype, instead of the logits: the backward pass is then one
    multiplication. Without a gradient (validation) only the loss is computed.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, mask: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        n, vocab = logits.shape
        want_grad = bool(ctx.needs_input_grad[0])
        grad = torch.empty_like(logits) if want_grad else None
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        mean = torch.empty_like(lse)
        chunk = _chunk_rows(logits)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            z = logits[lo:hi].to(torch.float32, copy=True)
            mean[lo:hi] = z.mean(-1)
            top = z.amax(-1, keepdim=True)
            e = z.sub_(top).exp_()  # in place: z is a private copy
            total = e.sum(-1, keepdim=True)
            lse[lo:hi] = (top + total.log()).squeeze(-1)
            if grad is not None:
                # softmax - eps / V - (1 - eps) * onehot(target), zero on padding
                e.div_(total).sub_(eps / vocab)
                rows = torch.arange(hi - lo, device=e.device)
                e[rows, target[lo:hi]] -= 1.0 - eps
                e.mul_(mask[lo:hi, None])
                grad[lo:hi] = e
        z_ref = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()
        nll = (lse - z_ref) * mask
        smooth = (lse - mean) * mask
        loss = (1.0 - eps) * nll + eps * smooth
        if grad is not None:
            ctx.save_for_backward(grad)
        return loss.sum(), nll.sum().detach()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None, None  # bf16 result, fp32 scalar


def label_smoothed_sums(
    logits: Tensor, target: Tensor, eps: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, nll sum) over non-padding tokens, without a host sync.

    The trainer knows its token counts from the batch, so it uses this form and never
    waits for the device to count the mask.
    """
    flat_logits = logits.reshape(-1, logits.size(-1))
    flat_target = target.reshape(-1)
    mask = (flat_target != pad_id).to(torch.float32)
    loss, nll = _SmoothedCrossEntropy.apply(flat_logits, flat_target, mask, float(eps))
    return loss, nll


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, eps: float, pad_id: int
) -> LossOutput:
    """logits (..., V), target (...) ids; padding positions contribute nothing."""
    loss, nll = label_smoothed_sums(logits, target, eps, pad_id)
    return LossOutput(loss=loss, nll=nll, tokens=int((target != pad_id).sum().item()))
