"""softmax(QK^T / sqrt(d_k)) V written out in PyTorch's operations.

Two callers want this form rather than `scaled_dot_product_attention`: those that need the
attention weights (`nmt attention`, alignments), and training on a CPU, where the fused
kernel's backward pass is 1.5-3x slower than these operations on sentence-length
sequences (BENCHMARKS.md). Training on a CPU takes its attention as a `TrainingAttention`
(`Transformer.set_cpu_attention`): by default `written_out_attention` here, the reference;
the CPU backend's compiled module has a faster one, tested against it
(backends/cpu/training.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

TrainingAttention = Callable[[Tensor, Tensor, Tensor, Tensor | None, bool], Tensor]
"""(q (B, h, L, d_k), k (B, h, S, d_k), v (B, h, S, d_v), key_mask (B, 1, 1, S) bool or
None, causal) -> the context (B, h, L, d_v), differentiable, without dropout."""


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    causal: bool,
    dropout_p: float = 0.0,
    training: bool = False,
) -> tuple[Tensor, Tensor]:
    """(context, weights). `key_mask` broadcasts to the scores (B, h, L, S), True where a
    key may be attended; `causal` hides key j from query i when j > i + S - L."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, float("-inf"))
    if causal:
        lq, lk = scores.shape[-2:]
        future = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(lk - lq + 1)
        scores = scores.masked_fill(future, float("-inf"))
    weights = scores.float().softmax(-1).to(v.dtype)
    ctx = F.dropout(weights, dropout_p, training) @ v
    return ctx, weights


def written_out_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool
) -> Tensor:
    """The reference TrainingAttention."""
    return explicit_attention(q, k, v, key_mask, causal)[0]
