"""Label-smoothed cross-entropy (section 5.4), fused into one pass over the logits.

The smoothed target puts 1 - eps on the reference token and spreads eps uniformly over
the whole vocabulary, so per token

    loss = (1 - eps) * nll + eps * mean_v(-log p_v),   nll = -log p_ref,

and with lse = logsumexp(z): nll = lse - z_ref and mean_v(-log p_v) = lse - mean(z).
Written this way nothing of size V is kept but the logits themselves; the backward pass
is softmax(z) - (1 - eps) * onehot - eps / V, computed in one expression instead of
autograd's chain through log_softmax, gather and mean (the log-softmax over the
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


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, mask: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        z = logits.float()
        lse = torch.logsumexp(z, dim=-1)
        z_ref = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        nll = (lse - z_ref) * mask
        smooth = (lse - z.mean(-1)) * mask
        loss = (1.0 - eps) * nll + eps * smooth
        ctx.save_for_backward(logits, target, mask, lse)
        ctx.eps = eps
        return loss.sum(), nll.sum().detach()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, mask, lse = ctx.saved_tensors
        eps: float = ctx.eps
        scale = (grad_loss * mask).unsqueeze(-1)  # (N, 1): padding gets no gradient
        grad = torch.exp(logits.float() - lse.unsqueeze(-1))
        grad -= eps / logits.size(-1)
        grad.scatter_add_(
            -1, target.unsqueeze(-1), torch.full_like(scale, -(1.0 - eps), dtype=grad.dtype)
        )
        grad *= scale
        return grad.to(logits.dtype), None, None, None


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, eps: float, pad_id: int
) -> LossOutput:
    """logits (..., V), target (...) ids; padding positions contribute nothing."""
    flat_logits = logits.reshape(-1, logits.size(-1))
    flat_target = target.reshape(-1)
    mask = (flat_target != pad_id).to(torch.float32)
    loss, nll = _SmoothedCrossEntropy.apply(flat_logits, flat_target, mask, float(eps))
    return LossOutput(loss=loss, nll=nll, tokens=int(mask.sum().item()))
