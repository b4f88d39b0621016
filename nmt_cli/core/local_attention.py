"""Restricted self-attention (Table 1's last row): each query sees only nearby keys.

One rule for both sides, with r = `model.attention_window`: a query at position i attends
to key j when |i - j| < r, and in the decoder also when j <= i. The encoder's
neighbourhood is centred on its query ("a neighborhood of size r in the input sequence
centered around the respective output position", section 4) and spans 2r - 1 positions;
the decoder's is the r newest, the query's own included, which is all its incremental
cache keeps (core/cache.py). A window at least as long as the sequence is full attention.

The band is computed in blocks, so time and memory grow as n * r rather than n^2: the
queries are cut into blocks of `block_size(r)` positions, and each block scores only the
keys of its own block and its neighbours (the one before it in the decoder, one either
side in the encoder), with the band drawn inside those. Where the sequence is no longer
than that span, the band is an ordinary n x n mask: then that is the smaller matrix.

PyTorch's FlexAttention with a sliding-window block mask computes the same band, but on
a CPU it runs only compiled (its eager form scores the full n x n matrix), has no
backward pass there (PyTorch 2.13), and its compiled forward took 18x as long as these
blocks (n = 4,096, r = 64, 2 cores); the blocks are plain batched products that run on
any device, under autocast and torch.compile.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Blocks below this many queries spend their time in per-block overhead, not arithmetic
# (small windows at n = 4,096 on a CPU: blocks of 16-32 fastest, of 4 twice as slow).
MIN_BLOCK = 32


def block_size(window: int) -> int:
    """Queries per block: at least the window, so a block's neighbours hold every key it
    may see."""
    return max(window, MIN_BLOCK)


def scored_keys(length: int, window: int, causal: bool) -> int:
    """How many keys each query scores: the whole sequence with a dense band mask, or the
    span of its block and neighbours; the smaller of the two is what runs."""
    if window <= 0 or window >= length:
        return length
    span = (2 if causal else 3) * block_size(window)
    return min(length, span)


def band_mask(
    length: int, window: int, causal: bool, key_mask: Tensor | None, device: torch.device
) -> Tensor:
    """(1 or B, 1, L, L) boolean, True where query i may attend key j: the band, minus
    padding keys. The diagonal always stays: a padding query far from every real token
    would otherwise see no key, and its row of NaN would spread through the next layer's
    weighted sums (0 * NaN); its output itself is never read."""
    pos = torch.arange(length, device=device)
    offset = pos[None, :] - pos[:, None]  # j - i
    allowed = _within(offset, window, causal)[None, None]
    if key_mask is not None:
        allowed = (allowed & key_mask) | (offset == 0)
    return allowed


def _within(offset: Tensor, window: int, causal: bool) -> Tensor:
    """The band rule on key-minus-query offsets."""
    allowed = offset.abs() < window
    return allowed & (offset <= 0) if causal else allowed


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    causal: bool,
    key_mask: Tensor | None,
    dropout_p: float,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + band) V over (B, h, n, d) tensors, block by block:
    -> (B, h, n, d_v). key_mask (B, 1, 1, n), True on real keys (the encoder's padding).

    Keys and values are padded by a block before (and after, in the encoder) and cut
    into overlapping spans (`unfold`: views, copied once by the products), so no score
    outside a block's span is ever computed: (B, h, n, span) scores, span = 2 or 3
    blocks."""
    batch, heads, n, _ = q.shape
    size = block_size(window)
    blocks = -(-n // size)
    tail = blocks * size - n
    before, after = size, tail + (0 if causal else size)
    span = before + size + (0 if causal else size)
    q_blocks = F.pad(q * (1.0 / math.sqrt(q.size(-1))), (0, 0, 0, tail))
    q_blocks = q_blocks.view(batch, heads, blocks, size, -1)
    k_spans = F.pad(k, (0, 0, before, after)).unfold(2, span, size)  # (B, h, blocks, d, span)
    v_spans = F.pad(v, (0, 0, before, after)).unfold(2, span, size).transpose(-1, -2)
    scores = q_blocks @ k_spans  # (B, h, blocks, size, span)

    # Query a of block b sits at b*size + a, key c of its span at (b - 1)*size + c.
    a = torch.arange(size, device=q.device)
    c = torch.arange(span, device=q.device)
    allowed = _within(c[None, :] - size - a[:, None], window, causal)  # (size, span)
    key_pos = torch.arange(blocks, device=q.device)[:, None] * size - size + c  # (blocks, span)
    real = (key_pos >= 0) & (key_pos < n)
    if key_mask is not None:
        padded = F.pad(key_mask.reshape(batch, 1, n), (before, after), value=False)
        real = real & padded.unfold(2, span, size)  # (B, 1, blocks, span)
    allowed = (allowed & real.unsqueeze(-2)) | (c[None, :] - size == a[:, None])
    scores.masked_fill_(~allowed, float("-inf"))  # in place: the product is not saved
    weights = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(v.dtype)
    ctx = F.dropout(weights, dropout_p, dropout_p > 0) @ v_spans
    return ctx.reshape(batch, heads, blocks * size, -1)[:, :, :n]
