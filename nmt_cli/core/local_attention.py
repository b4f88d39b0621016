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

The blocks are the batch rows of one `F.scaled_dot_product_attention` call, the band its
mask. On a CPU, without attention dropout, PyTorch runs its flash kernel: it scores a
cache-sized tile at a time and recomputes tiles in the backward pass rather than store
the weights. Blocks whose scores are written out make large temporaries, passed over
several times in fresh pages every call, and their time grows faster than n
(BENCHMARKS.md, "Restricted self-attention").

PyTorch's FlexAttention (a sliding-window block mask) computes the same band, but on a
CPU only compiled (eager, it scores the full n x n matrix), with no backward pass there
(PyTorch 2.13), and its compiled forward is many times slower than these blocks
(BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.core.attention import Attention, fused_attention
from nmt_cli.core.operations import Operations

# Blocks below this many queries spend their time in per-block overhead, not arithmetic:
# small windows take blocks of this size (BENCHMARKS.md, "Restricted self-attention").
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


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    causal: bool,
    key_mask: Tensor | None,
    dropout_p: float,
    ops: Operations,
) -> Tensor:
    """Attention within the band, in the smaller of its two forms: blocks
    (`blocked_attention`, by `ops.blocks`) or, where the sequence is no longer than a
    block's span, the whole sequence under a band mask (by `ops.attention`)."""
    length = q.size(2)
    if scored_keys(length, window, causal) < length:
        return blocked_attention(q, k, v, window, causal, key_mask, dropout_p, ops.blocks)
    band = band_mask(length, window, causal, key_mask, q.device)
    return ops.attention(q, k, v, band, False, dropout_p)


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    causal: bool,
    key_mask: Tensor | None,
    dropout_p: float,
    attend: Attention = fused_attention,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + band) V over (B, h, n, d) tensors, block by block:
    -> (B, h, n, d_v). key_mask (B, 1, 1, n), True on real keys (the encoder's padding);
    `attend` runs the blocks (the plan's `Operations.blocks`).

    SDPA's batch rows are (batch, block): queries (B * blocks, h, size, d), a view where
    n fills whole blocks; keys and values padded by a block before (and after, in the
    encoder) and cut into overlapping spans (B * blocks, h, span, d), copied once; the
    band and the padding a (B * blocks, 1, size, span) mask shared by the heads. With
    attention dropout PyTorch runs its written-out kernel: (B, h, n, span) weights."""
    batch, heads, n, d = q.shape
    size = block_size(window)
    blocks = -(-n // size)
    tail = blocks * size - n
    before, after = size, tail + (0 if causal else size)
    span = before + size + (0 if causal else size)
    q_blocks = _by_position(q, 0, tail).reshape(batch * blocks, size, heads, d).transpose(1, 2)
    k_spans, v_spans = (
        _by_position(x, before, after).unfold(1, span, size).transpose(-1, -2) for x in (k, v)
    )  # (B, blocks, h, span, d): views, then one copy each as SDPA's batch rows
    k_spans, v_spans = (x.reshape(batch * blocks, heads, span, -1) for x in (k_spans, v_spans))

    # Query a of block b sits at b*size + a, key c of its span at (b - 1)*size + c.
    a = torch.arange(size, device=q.device)
    c = torch.arange(span, device=q.device)
    allowed = _within(c[None, :] - size - a[:, None], window, causal)  # (size, span)
    key_pos = torch.arange(blocks, device=q.device)[:, None] * size - size + c  # (blocks, span)
    real = (key_pos >= 0) & (key_pos < n)
    if key_mask is not None:
        padded = F.pad(key_mask.reshape(batch, n), (before, after), value=False)
        real = real & padded.unfold(1, span, size)  # (B, blocks, span)
    allowed = (allowed & real.unsqueeze(-2)) | (c[None, :] - size == a[:, None])
    allowed = allowed.expand(batch, blocks, size, span).reshape(batch * blocks, 1, size, span)
    ctx = attend(q_blocks, k_spans, v_spans, allowed, False, dropout_p)
    # The CPU kernel's output is contiguous as (B * blocks, size, h, d_v): no copy here.
    ctx = ctx.transpose(1, 2).reshape(batch, blocks * size, heads, -1)
    return ctx[:, :n].transpose(1, 2)


def _by_position(x: Tensor, before: int, after: int) -> Tensor:
    """(B, h, n, d) -> (B, before + n + after, h, d), zeros around: a view if none."""
    x = x.transpose(1, 2)
    return F.pad(x, (0, 0, 0, 0, before, after)) if before or after else x
