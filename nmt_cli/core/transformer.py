"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), section 3.

Post-norm residual blocks `LayerNorm(x + Dropout(Sublayer(x)))` (or, with `pre_norm`,
`x + Dropout(Sublayer(LayerNorm(x)))` and a final LayerNorm per stack), multi-head
scaled dot-product attention (core/attention.py), a ReLU feed-forward, sinusoidal (or learned)
positions, and one embedding matrix shared by the source embedding, the target embedding
and the pre-softmax projection (section 3.4), scaled by sqrt(d_model). Two settings
beyond the paper let models trained elsewhere run unchanged: the feed-forward's
activation (`ModelConfig.activation`) and a bias on the projection (`output_bias`).

Shapes: B batch, S source length, T target length, D d_model, V vocabulary.
Padding is always on the right, so the decoder's causal mask also hides target padding
from every real position; source padding is masked explicitly with a key mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.core.attention import attention_with_weights
from nmt_cli.core.beam_advance import decode_then_advance, torch_advance
from nmt_cli.core.cache import AttentionCache, DecoderCache, StepCache
from nmt_cli.core.dropout import Dropout
from nmt_cli.core.embedding import Embedding, sinusoidal_positions
from nmt_cli.core.local_attention import band_mask, banded_attention
from nmt_cli.core.model_config import Activation, ModelConfig, PositionKind
from nmt_cli.core.norm import LayerNorm
from nmt_cli.core.open_sentence import search_loop_only
from nmt_cli.core.operations import REFERENCE, Operations
from nmt_cli.core.step_linear import linear, linear_add, linear_relu

__all__ = ["ModelConfig", "Operations", "PositionKind", "Transformer", "sinusoidal_positions"]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (section 3.2.2) with d_k and d_v separate.

    Query, key and value projections are fused into one matrix for self-attention and one
    key/value matrix for cross-attention, so each attention costs one or two matrix
    products instead of three.
    """

    def __init__(self, cfg: ModelConfig, self_attention: bool, ops: Operations) -> None:
        super().__init__()
        self.ops = ops  # how attention runs: the plan's choice (core/operations.py)
        self.h = cfg.n_heads
        self.d_k = cfg.head_dim_k
        self.d_v = cfg.head_dim_v
        self.self_attention = self_attention
        qk, v = self.h * self.d_k, self.h * self.d_v
        if self_attention:
            self.qkv = ops.linear(cfg.d_model, 2 * qk + v)
        else:
            self.q = ops.linear(cfg.d_model, qk)
            self.kv = ops.linear(cfg.d_model, qk + v)
        self.out = ops.linear(v, cfg.d_model)
        self.dropout_p = cfg.attention_dropout
        # Restricted self-attention (core/local_attention.py); cross-attention stays full.
        self.window = cfg.attention_window if self_attention else 0

    def _heads(self, x: Tensor, dim: int) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.h, dim).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output, computed once per source sentence."""
        k, v = self.kv(memory).split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def _deferred_bias(self) -> Tensor | None:
        """The q, k and v projections' biases end to end where the plan's
        `biased_attention` adds them (each projection an `nn.Linear` with a bias), else
        None: the projections add their own."""
        layers = [self.qkv] if self.self_attention else [self.q, self.kv]
        biases: list[Tensor] = [
            m.bias for m in layers if isinstance(m, nn.Linear) and m.bias is not None
        ]
        if self.ops.biased_attention is None or len(biases) < len(layers):
            return None
        return biases[0] if len(biases) == 1 else torch.cat(biases)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, D), key_mask (B, 1, 1, M) boolean, True where a key may be attended ->
        (B, L, D), and the weights (B, h, L, M) only when asked for."""
        ctx, weights = self.context(x, memory, key_mask, causal, need_weights)
        return self.out(ctx), weights

    def context(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """`forward` before the output projection (which a layer may fuse into its
        residual add): the heads' contexts merged, (B, L, h * d_v)."""
        length = x.size(1)
        banded = 0 < self.window < length
        bias = None if need_weights or banded else self._deferred_bias()

        def project(layer: nn.Module, x: Tensor) -> Tensor:  # without its bias if deferred
            return layer(x) if bias is None else F.linear(x, cast(nn.Linear, layer).weight)

        qk, vd = self.h * self.d_k, self.h * self.d_v
        if self.self_attention:
            q, k, v = project(self.qkv, x).split([qk, qk, vd], dim=-1)
        else:
            assert memory is not None, "cross-attention needs the encoder output"
            q, (k, v) = project(self.q, x), project(self.kv, memory).split([qk, vd], dim=-1)
        q, k, v = self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)
        dropout_p = self.dropout_p if self.training else 0.0
        weights: Tensor | None = None
        if bias is not None:
            assert self.ops.biased_attention is not None
            ctx = self.ops.biased_attention(q, k, v, bias, key_mask, causal, dropout_p)
        elif need_weights:  # the reference, which alone gives the weights
            if banded:
                key_mask, causal = band_mask(length, self.window, causal, key_mask, q.device), False
            ctx, weights = attention_with_weights(q, k, v, key_mask, causal, dropout_p)
        elif banded:
            ctx = banded_attention(q, k, v, self.window, causal, key_mask, dropout_p, self.ops)
        else:
            ctx = self.ops.attention(q, k, v, key_mask, causal, dropout_p)
        b, _, length, _ = ctx.shape
        return ctx.transpose(1, 2).reshape(b, length, self.h * self.d_v), weights

    def step(
        self,
        x: Tensor,
        cache: AttentionCache,
        residual: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """`forward` for one new query per row, x (B, D), continuing the cache (inference
        only) -> `residual` + the output (B, D), and the weights (B, h, 1, keys) if asked.

        Self-attention appends this position's keys/values and attends the whole prefix
        (the newest position sees every cached key: no causal mask); cross-attention
        projects `memory` on the first step only. The cache attends (core/cache.py), and
        the output projection adds the residual in its product where it can."""
        if self.self_attention:
            sizes = [self.h * self.d_k] * 2 + [self.h * self.d_v]  # (split_with_sizes: the
            q, k, v = linear(self.qkv, x).split_with_sizes(sizes, dim=-1)  # op itself)
            ctx, weights = cache.attend_self(q, k, v, need_weights)
        else:
            q = linear(self.q, x)
            if not cache.has_memory():
                assert memory is not None and key_mask is not None, "the first step needs them"
                cache.store_memory(*self.project_kv(memory), key_mask)
            ctx, weights = cache.attend_memory(q, need_weights)
        return linear_add(self.out, ctx.to(x.dtype), residual), weights


ACTIVATION_FUNCTIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,  # x * sigmoid(x), "swish"
    "gelu": F.gelu,  # the exact (erf) form
}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3), or another activation than max."""

    def __init__(self, cfg: ModelConfig, ops: Operations) -> None:
        super().__init__()
        self.w1 = ops.linear(cfg.d_model, cfg.d_ff)
        self.w2 = ops.linear(cfg.d_ff, cfg.d_model)
        self.relu_dropout = Dropout(cfg.relu_dropout, ops.keep_mask)
        self.activation = cfg.activation
        self.act = ACTIVATION_FUNCTIONS[cfg.activation]
        self.dense_relu = ops.dense_relu  # the plan's (core/operations.py)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.hidden(x))

    def hidden(self, x: Tensor) -> Tensor:
        """`forward` before the second layer (which a layer may fuse into its residual
        add): the activations after their dropout."""
        if self.activation == "relu" and isinstance(self.w1, nn.Linear):
            hidden = self.dense_relu(x, self.w1.weight, self.w1.bias)
        elif self.activation == "relu":  # a backend's decoding layer: ReLU in its product
            hidden = linear_relu(self.w1, x)
        else:
            hidden = self.act(self.w1(x))
        return self.relu_dropout(hidden)

    def step(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + FFN(x) for decoding (no dropout), with the ReLU and the residual add
        fused into the products where the layers can."""
        if self.activation == "relu":
            return linear_add(self.w2, linear_relu(self.w1, x), residual)
        return linear_add(self.w2, self.act(linear(self.w1, x)), residual)


class Sublayers(nn.Module):
    """Where a layer's LayerNorms sit, decided once for `forward` and `step`: after each
    residual add (section 3.1's post-norm) or, with `pre_norm`, on each sublayer's input
    (fairseq's `normalize_before`), leaving the residual stream itself unnormalized."""

    def __init__(self, cfg: ModelConfig, ops: Operations) -> None:
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.dropout = Dropout(cfg.dropout, ops.keep_mask, ops.dropout_add)

    def before(self, norm: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        return norm(x) if self.pre_norm else x

    def after(self, norm: Callable[[Tensor], Tensor], total: Tensor) -> Tensor:
        """The stream after `total` = x + Dropout(Sublayer(...))."""
        return total if self.pre_norm else norm(total)


class EncoderLayer(Sublayers):
    def __init__(self, cfg: ModelConfig, ops: Operations) -> None:
        super().__init__(cfg, ops)
        self.self_attn = MultiHeadAttention(cfg, True, ops)
        self.ffn = FeedForward(cfg, ops)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)

    def forward(
        self, x: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        attn, ffn = self.self_attn, self.ffn
        a, weights = attn.context(self.before(self.norm1, x), None, src_mask, False, need_weights)
        x = self.after(self.norm1, self.dropout.add_linear(x, attn.out, a))
        f = ffn.hidden(self.before(self.norm2, x))
        return self.after(self.norm2, self.dropout.add_linear(x, ffn.w2, f)), weights


@dataclass
class DecoderOutput:
    hidden: Tensor  # (B, T, D)
    cross_attention: list[Tensor] | None  # one (B, h, T, S) per layer when asked for
    self_attention: list[Tensor] | None = None  # one (B, h, T, prefix + T) per layer


class DecoderLayer(Sublayers):
    def __init__(self, cfg: ModelConfig, ops: Operations) -> None:
        super().__init__(cfg, ops)
        self.self_attn = MultiHeadAttention(cfg, True, ops)
        self.cross_attn = MultiHeadAttention(cfg, False, ops)
        self.ffn = FeedForward(cfg, ops)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)
        self.norm3 = LayerNorm(cfg.d_model)

    def forward(
        self, y: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """-> (output, self-attention weights, cross-attention weights); weights only
        when asked for."""
        add = self.dropout.add_linear  # residual + dropout(the sublayer's last layer)
        x = self.before(self.norm1, y)
        a, own = self.self_attn.context(x, causal=True, need_weights=need_weights)
        y = self.after(self.norm1, add(y, self.self_attn.out, a))
        x = self.before(self.norm2, y)
        c, cross = self.cross_attn.context(x, memory, src_mask, need_weights=need_weights)
        y = self.after(self.norm2, add(y, self.cross_attn.out, c))
        f = self.ffn.hidden(self.before(self.norm3, y))
        return self.after(self.norm3, add(y, self.ffn.w2, f)), own, cross

    def step(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: AttentionCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """`forward` for one new position per row, y (B, D), continuing the cached prefix;
        inference only (no dropout)."""
        x = self.before(self.norm1.step, y)
        y, self_w = self.self_attn.step(x, cache, residual=y, need_weights=need_weights)
        y = self.after(self.norm1.step, y)
        x = self.before(self.norm2.step, y)
        y, cross_w = self.cross_attn.step(x, cache, y, memory, src_mask, need_weights)
        y = self.after(self.norm2.step, y)
        y = self.ffn.step(self.before(self.norm3.step, y), y)
        return self.after(self.norm3.step, y), self_w, cross_w


class Transformer(nn.Module):
    """Encoder-decoder Transformer with the interface search and training need.

    `forward` is teacher-forced training; `encode` + `decode_step` is incremental decoding,
    the only way search sees the model. `ops` says how the hot operations run (the
    planner's choice for a device and precision; by default the references).
    """

    def __init__(self, cfg: ModelConfig, ops: Operations = REFERENCE) -> None:
        super().__init__()
        if cfg.src_vocab_size < 1 or cfg.tgt_vocab_size < 1:
            raise ValueError(
                "the model needs src_vocab_size and tgt_vocab_size from the vocabulary"
            )
        self.cfg = cfg
        self.max_positions = cfg.max_positions  # the longest source (with EOS) and output
        tgt_tokens = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        src_tokens = (
            tgt_tokens
            if cfg.three_way_tying
            else nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        for emb in {id(e): e for e in (src_tokens, tgt_tokens)}.values():
            # std d^-0.5 so that the sqrt(d) scale gives unit-variance inputs.
            nn.init.normal_(emb.weight, std=cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        self.src_embed = Embedding(src_tokens, cfg, ops.keep_mask)
        self.tgt_embed = Embedding(tgt_tokens, cfg, ops.keep_mask)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, ops) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, ops) for _ in range(cfg.decoder_layers))
        # Pre-norm's LayerNorms after the last layer (fairseq's encoder/decoder.layer_norm).
        self.encoder_norm = LayerNorm(cfg.d_model) if cfg.pre_norm else None
        self.decoder_norm = LayerNorm(cfg.d_model) if cfg.pre_norm else None
        self.output_bias = (
            nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        )
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection: the target embedding matrix itself (section 3.4)."""
        return self.tgt_embed.tokens.weight

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S), True on real tokens: the key mask for attention over the source."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src: (B, S) token ids -> (B, S, D)."""
        return self.encode_with_attention(src, src_mask, need_weights=False)[0]

    def encode_with_attention(
        self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = True
    ) -> tuple[Tensor, list[Tensor]]:
        """`encode`, plus every encoder layer's self-attention weights (B, h, S, S), by
        the reference attention (equal to `encode`'s output up to rounding)."""
        x = self.src_embed(src)
        src_mask = self.source_mask(src) if src_mask is None else src_mask
        weights: list[Tensor] = []
        for layer in self.encoder:
            x, w = layer(x, src_mask, need_weights)
            weights += [] if w is None else [w]
        return (x if self.encoder_norm is None else self.encoder_norm(x)), weights

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> DecoderOutput:
        """tgt_in: (B, T) ids, every position at once (teacher forcing)."""
        y = self.tgt_embed(tgt_in)
        cross: list[Tensor] = []
        own: list[Tensor] = []
        for layer in self.decoder:
            y, self_w, cross_w = layer(y, memory, src_mask, need_weights)
            if self_w is not None and cross_w is not None:
                own.append(self_w)
                cross.append(cross_w)
        y = y if self.decoder_norm is None else self.decoder_norm(y)
        if not need_weights:
            return DecoderOutput(y, None)
        return DecoderOutput(y, cross, own)

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., D) -> (..., V) through the tied output projection (and `output_bias`)."""
        return F.linear(hidden, self.output_weight, self.output_bias)

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher forcing: (B, S), (B, T) -> logits (B, T, V); with `project=False` the
        decoder's last hidden states (B, T, D), for a loss that applies the output
        projection itself chunk by chunk (`core/losses.projected_label_smoothed_sums`)."""
        src_mask = self.source_mask(src)
        memory = self.encode(src, src_mask)
        hidden = self.decode(tgt_in, memory, src_mask).hidden
        return self.logits(hidden) if project else hidden

    advance = staticmethod(torch_advance)  # search's bookkeeping: the reference
    decode_advance = decode_then_advance  # a whole beam step: the reference
    finish_sentence = search_loop_only  # search's own loop: the reference

    def slots(self, open_sentences: int, beam: int) -> int:
        """The reference keeps no finished sentence as filler."""
        return open_sentences

    def new_cache(self, dtype: torch.dtype | None = None) -> DecoderCache:
        """An empty cache (core/cache.py) that attends in `dtype` (None: the model's)."""
        first = cast(DecoderLayer, self.decoder[0]).self_attn
        dtype = dtype or self.output_weight.dtype
        return DecoderCache.empty(len(self.decoder), dtype, first.h, self.cfg.attention_window)

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: StepCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """One decoding step: (B,) newest tokens -> float32 log-probabilities (B, V) of
        the next. With `need_weights`, also the step's attention weights as one flat list
        of row-first tensors (what search records): every decoder layer's self-attention
        (B, h, 1, prefix + 1), then every layer's cross-attention (B, h, 1, S)."""
        hidden, weights = self.step_hidden(last_tokens, memory, src_mask, cache, need_weights)
        return torch.log_softmax(self.logits(hidden), -1, dtype=torch.float32), weights

    def step_hidden(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: StepCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """`decode_step` up to the decoder's last hidden states (B, D), before the output
        projection: the part a decoding backend reuses with its own projection."""
        y = self.tgt_embed.step(last_tokens, cache.length)
        own: list[Tensor] = []
        cross: list[Tensor] = []
        layer_caches: Sequence[AttentionCache] = cache.layers
        for layer, layer_cache in zip(self.decoder, layer_caches, strict=True):
            step = cast(DecoderLayer, layer).step
            y, self_w, cross_w = step(y, memory, src_mask, layer_cache, need_weights)
            if self_w is not None and cross_w is not None:
                own.append(self_w)
                cross.append(cross_w)
        cache.length += 1
        y = y if self.decoder_norm is None else self.decoder_norm.step(y)
        return y, [*own, *cross] if need_weights else None
