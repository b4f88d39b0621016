"""Floating-point operations of the Transformer, for training-cost figures (Table 2, 3).

Counted, not estimated: the matrix products of one forward pass over a padded batch
(projections, attention scores and weighted sums, feed-forward, output projection; a
multiply-add is 2 operations), times 3 for forward plus backward. Element-wise work
(softmax, LayerNorm, dropout) is left out, as is usual, being a few percent at most.

The paper's Table 2 estimated the cost differently, as training time x number of GPUs x
the GPU's sustained single-precision rate; `nmt run` reports both.
"""

from __future__ import annotations

import math
import time

import torch

from nmt_cli.core.local_attention import scored_keys
from nmt_cli.core.transformer import ModelConfig


def forward_flops(cfg: ModelConfig, sentences: int, src_len: int, tgt_len: int) -> float:
    """Matrix-product FLOPs of one teacher-forced forward pass over a (sentences x src_len,
    sentences x tgt_len) padded batch."""
    d, f, h = cfg.d_model, cfg.d_ff, cfg.n_heads
    qk, v = h * cfg.head_dim_k, h * cfg.head_dim_v  # widths of all heads together
    s, t, window = src_len, tgt_len, cfg.attention_window

    def projections(tokens: int) -> float:  # Q, K, V in and the output projection
        return 2.0 * tokens * d * (2 * qk + v) + 2.0 * tokens * v * d

    def attention(queries: int, keys: int) -> float:  # scores and weighted sums
        return 2.0 * queries * keys * (qk + v)

    ffn = 4.0 * d * f  # the feed-forward, per token
    # Self-attention scores the keys it computes: all of them, or a restricted window's.
    own_s, own_t = scored_keys(s, window, causal=False), scored_keys(t, window, causal=True)
    encoder = cfg.encoder_layers * (projections(s) + attention(s, own_s) + s * ffn)
    cross = (
        2.0 * t * d * qk  # queries
        + 2.0 * s * d * (qk + v)  # keys and values of the source
        + 2.0 * t * v * d  # output projection
        + attention(t, s)
    )
    decoder = cfg.decoder_layers * (projections(t) + attention(t, own_t) + cross + t * ffn)
    logits = 2.0 * t * d * cfg.tgt_vocab_size
    return sentences * (encoder + decoder + logits)


def train_flops(cfg: ModelConfig, sentences: int, src_len: int, tgt_len: int) -> float:
    """Forward plus backward (the backward pass costs twice the forward's products)."""
    return 3.0 * forward_flops(cfg, sentences, src_len, tgt_len)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 1024, reps: int = 5) -> float:
    """The device's sustained matrix-product rate (FLOP/s) in `dtype`: the best of `reps`
    n x n products after a warm-up, the stand-in for the paper's "sustained
    single-precision floating-point capacity" of a GPU (Table 2's footnote)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = math.inf
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first product warms up kernels and caches
            best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best
