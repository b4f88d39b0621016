"""Scaled dot-product attention (section 3.2.1), written once: the reference.

softmax(QK^T / sqrt(d_k) + mask) V over (B, h, L, d) heads. Every form the model uses
is this arithmetic: whole sequences in training and encoding (full, causal, with a
padding mask), one query against a decoding cache (core/cache.py), and the weights for
pictures and alignments. Faster implementations (PyTorch's fused kernels, a backend's
compiled one) take its place through the plan (core/operations.py) and are tested
against it; only the band of restricted attention (core/local_attention.py) is written
separately, because its blocks change what is computed, not how fast.

Rows x heads are folded into one batch dimension so the two products are plain batched
products (`bmm`, free views of a contiguous decoding cache), and a mask enters as an
additive bias of 0 and -inf (in the first product itself, `baddbmm`, where the bias is a
decoding cache's, one per row and head): adding 0 or -inf is exact, so this equals
masking the scores afterwards, bit for bit.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class Attention(Protocol):
    """An implementation of this arithmetic: q (B, h, L, d_k), k (B, h, S, d_k),
    v (B, h, S, d_v) -> the context (B, h, L, d_v), differentiable. `mask` broadcasts to
    the scores (B, h, L, S): boolean, True where a key may be attended, or an additive
    float bias; `causal` hides key j from query i when j > i + S - L."""

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor: ...


def attention_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """(context (B, h, L, d_v), weights (B, h, L, S) in v's dtype); the softmax in at
    least float32. Dropout (training) applies to the weights the context is made from,
    not to the weights returned."""
    b, h, length, d_k = q.shape
    keys = k.size(2)
    bias = _bias(mask, causal, length, keys, q)
    queries = q.reshape(b * h, length, d_k)
    keys_t = k.reshape(b * h, keys, d_k).transpose(1, 2)
    scale = 1.0 / math.sqrt(d_k)
    if bias is not None and bias.shape == (b, h, length, keys) and bias.is_contiguous():
        # a bias per row and head (a decoding cache's): added in the product itself
        scores = torch.baddbmm(bias.view(b * h, length, keys), queries, keys_t, alpha=scale)
    else:
        scores = torch.bmm(queries, keys_t).mul_(scale)
        if bias is not None:  # broadcast over heads and queries, never copied out
            scores = scores.view(b, h, length, keys).add_(bias).view(b * h, length, keys)
    weights = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(v.dtype)
    dropped = F.dropout(weights, dropout_p, True) if dropout_p > 0.0 else weights
    ctx = torch.bmm(dropped, v.reshape(b * h, keys, v.size(-1)))
    return ctx.view(b, h, length, -1), weights.view(b, h, length, keys)


class BiasedAttention(Protocol):
    """Attention on projections whose biases it adds itself: `Attention` of
    (q + b_q, k + b_k, v + b_v), with `bias` the three biases end to end (h d_k, h d_k,
    h d_v: a fused projection's, or the query's and the key-value projection's joined),
    and q, k and v the heads of the projections' products without them. A backend that
    adds them as it reads q, k and v saves the pass that adds them to the products'
    outputs (and sums their gradients as it writes q's, k's and v's)."""

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor: ...


def add_head_biases(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v (B, h, n, d) plus their parts of `bias` (BiasedAttention's), per head."""
    h, d_k, d_v = q.size(1), q.size(-1), v.size(-1)
    b_q, b_k, b_v = bias.split([h * d_k, h * d_k, h * d_v])
    return q + b_q.view(h, 1, d_k), k + b_k.view(h, 1, d_k), v + b_v.view(h, 1, d_v)


def biased_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The reference `BiasedAttention`: the biases added, then the reference."""
    return attention(*add_head_biases(q, k, v, bias), mask, causal, dropout_p)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The reference `Attention`: the context alone."""
    return attention_with_weights(q, k, v, mask, causal, dropout_p)[0]


def _bias(mask: Tensor | None, causal: bool, length: int, keys: int, like: Tensor) -> Tensor | None:
    """The mask and the causal rule as one additive bias of 0 and -inf that broadcasts to
    the scores (B, h, L, S), or None."""
    if mask is None and not causal:
        return None
    bias = torch.zeros((), dtype=like.dtype, device=like.device)
    if mask is not None and mask.is_floating_point():
        bias = mask.to(like.dtype)
    elif mask is not None:
        bias = torch.zeros(mask.shape, dtype=like.dtype, device=like.device)
        bias.masked_fill_(~mask, -math.inf)
    if causal:
        future = torch.ones(length, keys, dtype=torch.bool, device=like.device)
        causal_bias = torch.zeros(length, keys, dtype=like.dtype, device=like.device)
        bias = bias + causal_bias.masked_fill_(future.triu(keys - length + 1), -math.inf)
    return bias


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The same arithmetic as one call of PyTorch's `scaled_dot_product_attention`,
    whose kernel PyTorch chooses (a backend may narrow the choice)."""
    return F.scaled_dot_product_attention(q, k, v, mask, dropout_p, causal)
