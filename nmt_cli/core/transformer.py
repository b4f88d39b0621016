"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), section 3.

Post-norm residual blocks `LayerNorm(x + Dropout(Sublayer(x)))` (or, with `pre_norm`,
`x + Dropout(Sublayer(LayerNorm(x)))` and a final LayerNorm per stack), multi-head attention
through `scaled_dot_product_attention`, a ReLU feed-forward, sinusoidal (or learned)
positions, and one embedding matrix shared by the source embedding, the target embedding
and the pre-softmax projection (section 3.4), scaled by sqrt(d_model). Two settings
beyond the paper let models trained elsewhere run unchanged: the feed-forward's
activation (`ModelConfig.activation`) and a bias on the projection (`output_bias`).

Shapes: B batch, S source length, T target length, D d_model, V vocabulary.
Padding is always on the right, so the decoder's causal mask also hides target padding
from every real position; source padding is masked explicitly with a key mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.core.attention_kernels import (
    AttentionBackend,
    backend_scope,
    check_policy,
    mask_kind,
    sdpa_backends,
)
from nmt_cli.core.cache import AttentionCache, DecoderCache, StepCache
from nmt_cli.core.dropout import Dropout, KeepMask
from nmt_cli.core.local_attention import band_mask, blocked_attention, scored_keys
from nmt_cli.core.model_config import Activation, ModelConfig, PositionKind
from nmt_cli.core.norm import LayerNorm
from nmt_cli.core.step_linear import linear, linear_add, linear_relu
from nmt_cli.core.written_attention import (
    TrainingAttention,
    explicit_attention,
    written_out_attention,
)

__all__ = ["ModelConfig", "PositionKind", "Transformer", "count_parameters"]


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), section 3.5."""
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / d_model)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class Embedding(nn.Module):
    """Token embedding times sqrt(d_model), plus positions, then dropout (section 3.4, 5.4)."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)
        self.learned: nn.Embedding | None = None
        if cfg.positions == "learned":
            self.learned = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.learned.weight, std=cfg.d_model**-0.5)
        else:
            self.register_buffer(
                "table", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False
            )

    def positions(self, start: int, length: int) -> Tensor:
        if self.learned is not None:
            return self.learned.weight[start : start + length]
        table = self.get_buffer("table")
        return table[start : start + length]

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale + self.positions(start, ids.size(1))
        return self.dropout(_autocast_stream(x))

    def step(self, ids: Tensor, position: int) -> Tensor:
        """`forward` for one position per row, ids (B,) -> (B, D); inference only."""
        x = F.embedding(ids, self.tokens.weight) * self.scale + self.positions(position, 1)
        return _autocast_stream(x)


def _autocast_stream(x: Tensor) -> Tensor:
    """Under autocast, start the residual stream in the low precision: otherwise every
    residual add promotes it back to fp32 and each linear layer casts its input again."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


@dataclass
class AttentionOutput:
    """The attended values and, only on the explicit path, the attention weights."""

    values: Tensor  # (B, L, D)
    weights: Tensor | None  # (B, h, L, M) when asked for


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (section 3.2.2) with d_k and d_v separate.

    Query, key and value projections are fused into one matrix for self-attention and one
    key/value matrix for cross-attention, so each attention costs one or two matrix
    products instead of three.
    """

    def __init__(self, cfg: ModelConfig, self_attention: bool) -> None:
        super().__init__()
        self.h = cfg.n_heads
        self.d_k = cfg.head_dim_k
        self.d_v = cfg.head_dim_v
        self.self_attention = self_attention
        qk, v = self.h * self.d_k, self.h * self.d_v
        if self_attention:
            self.qkv = nn.Linear(cfg.d_model, 2 * qk + v)
        else:
            self.q = nn.Linear(cfg.d_model, qk)
            self.kv = nn.Linear(cfg.d_model, qk + v)
        self.out = nn.Linear(v, cfg.d_model)
        self.dropout_p = cfg.attention_dropout
        # Which SDPA kernels may run on a GPU (core/attention_kernels.py); not part of the weights.
        self.backend: AttentionBackend = "auto"
        # Training's attention on a CPU, the reference or a compiled one; not part of the weights.
        self.cpu_attention: TrainingAttention = written_out_attention
        # Restricted self-attention (core/local_attention.py); cross-attention stays full.
        self.window = cfg.attention_window if self_attention else 0

    def _heads(self, x: Tensor, dim: int) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.h, dim).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output, computed once per source sentence."""
        k, v = self.kv(memory).split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """x: (B, L, D). key_mask: (B, 1, 1, M) boolean, True where a key may be attended."""
        if self.self_attention:
            q, k, v = self.qkv(x).split([self.h * self.d_k] * 2 + [self.h * self.d_v], dim=-1)
            q, k, v = self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)
        else:
            assert memory is not None, "cross-attention needs the encoder output"
            q = self._heads(self.q(x), self.d_k)
            k, v = self.project_kv(memory)
        dropout_p = self.dropout_p if self.training else 0.0
        weights: Tensor | None = None
        length = q.size(2)
        blocked = not need_weights and scored_keys(length, self.window, causal) < length
        if 0 < self.window < length and not blocked:  # the band as a mask: the smaller form
            key_mask = band_mask(length, self.window, causal, key_mask, q.device)
            causal = False
        if blocked:
            ctx = blocked_attention(q, k, v, self.window, causal, key_mask, dropout_p, self.backend)
        elif need_weights:
            ctx, weights = explicit_attention(q, k, v, key_mask, causal, dropout_p, self.training)
        elif self.training and q.device.type == "cpu":
            # Training on a CPU with sentence-length sequences: the fused kernel's backward
            # pass is 1.5-3x slower than the written-out form (core/written_attention.py).
            # A compiled graph takes the reference, which dynamo traces (no graph break).
            if dropout_p == 0.0 and not torch.compiler.is_compiling():
                ctx = self.cpu_attention(q, k, v, key_mask, causal)
            else:
                ctx, _ = explicit_attention(q, k, v, key_mask, causal, dropout_p, True)
        else:
            kind = mask_kind(key_mask, causal)
            with backend_scope(sdpa_backends(self.backend, q.device.type, q.dtype, kind)):
                ctx = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=key_mask, dropout_p=dropout_p, is_causal=causal
                )
        b, _, length, _ = ctx.shape
        ctx = ctx.transpose(1, 2).reshape(b, length, self.h * self.d_v)
        return AttentionOutput(self.out(ctx), weights)

    def step(
        self,
        x: Tensor,
        cache: AttentionCache,
        residual: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """One new query per row (incremental decoding, inference only): x (B, D) ->
        `residual` + the attention's output (B, D), and its weights (B, h, 1, keys) when
        asked for.

        Self-attention appends this position's keys/values to the cache and attends over
        the whole prefix (no causal mask: the newest position may see every cached key).
        Cross-attention projects `memory` on the first step and reads the cache after.
        The cache computes the attention itself, the way its layout wants
        (core/cache.py), and the output projection adds the residual
        (core/step_linear.linear_add): a step is mostly per-operation overhead, so
        every operation saved counts.
        """
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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.relu_dropout = Dropout(cfg.relu_dropout)
        self.activation = cfg.activation
        self.act = ACTIVATION_FUNCTIONS[cfg.activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.relu_dropout(self.act(self.w1(x))))

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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.dropout = Dropout(cfg.dropout)

    def before(self, norm: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        return norm(x) if self.pre_norm else x

    def after(self, norm: Callable[[Tensor], Tensor], total: Tensor) -> Tensor:
        """The stream after `total` = x + Dropout(Sublayer(...))."""
        return total if self.pre_norm else norm(total)


class EncoderLayer(Sublayers):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.ffn = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)

    def forward(
        self, x: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        a = self.self_attn(self.before(self.norm1, x), key_mask=src_mask, need_weights=need_weights)
        x = self.after(self.norm1, self.dropout.add(x, a.values))
        f = self.ffn(self.before(self.norm2, x))
        return self.after(self.norm2, self.dropout.add(x, f)), a.weights


@dataclass
class DecoderOutput:
    hidden: Tensor  # (B, T, D)
    cross_attention: list[Tensor] | None  # one (B, h, T, S) per layer when asked for
    self_attention: list[Tensor] | None = None  # one (B, h, T, prefix + T) per layer


class DecoderLayer(Sublayers):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.cross_attn = MultiHeadAttention(cfg, self_attention=False)
        self.ffn = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.d_model)
        self.norm2 = LayerNorm(cfg.d_model)
        self.norm3 = LayerNorm(cfg.d_model)

    def forward(
        self, y: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """-> (output, self-attention weights, cross-attention weights); weights only
        when asked for."""
        a = self.self_attn(self.before(self.norm1, y), causal=True, need_weights=need_weights)
        y = self.after(self.norm1, self.dropout.add(y, a.values))
        c = self.cross_attn(self.before(self.norm2, y), memory, src_mask, need_weights=need_weights)
        y = self.after(self.norm2, self.dropout.add(y, c.values))
        f = self.ffn(self.before(self.norm3, y))
        return self.after(self.norm3, self.dropout.add(y, f)), a.weights, c.weights

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
    the only way search sees the model.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.src_vocab_size < 1 or cfg.tgt_vocab_size < 1:
            raise ValueError(
                "the model needs src_vocab_size and tgt_vocab_size from the vocabulary"
            )
        self.cfg = cfg
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
        self.src_embed = Embedding(src_tokens, cfg)
        self.tgt_embed = Embedding(tgt_tokens, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
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
    def max_positions(self) -> int:
        """Positions the embeddings have: the longest source (with EOS) and output."""
        return self.cfg.max_positions

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection: the target embedding matrix itself (section 3.4)."""
        return self.tgt_embed.tokens.weight

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S), True on real tokens: the key mask for attention over the source."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src: (B, S) token ids -> (B, S, D)."""
        return self._encode(src, src_mask, need_weights=False)[0]

    def encode_with_attention(
        self, src: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """`encode`, plus every encoder layer's self-attention weights (B, h, S, S).

        The written-out attention replaces the fused kernel here, so the output equals
        `encode`'s up to rounding; used only when a caller wants pictures or alignments.
        """
        return self._encode(src, src_mask, need_weights=True)

    def _encode(
        self, src: Tensor, src_mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, list[Tensor]]:
        if src_mask is None:
            src_mask = self.source_mask(src)
        x = self.src_embed(src)
        weights: list[Tensor] = []
        for layer in self.encoder:
            x, w = layer(x, src_mask, need_weights)
            if w is not None:
                weights.append(w)
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

    def set_dropout_mask(self, keep_mask: KeepMask) -> None:
        """Where every dropout's mask comes from on a CPU (core/dropout.py)."""
        for module in self.modules():
            if isinstance(module, Dropout):
                module.keep_mask = keep_mask

    def set_cpu_attention(self, attention: TrainingAttention) -> None:
        """How every attention layer attends while training on a CPU (core/written_attention.py)."""
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.cpu_attention = attention

    def set_attention_backend(self, policy: AttentionBackend) -> None:
        """Which SDPA kernels every attention layer may use on a GPU (core/attention_kernels.py)."""
        check_policy(policy)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.backend = policy

    def new_cache(self) -> DecoderCache:
        """An empty cache (core/cache.py). On a CPU it attends in float32 whatever the
        model's dtype (oneDNN's bf16 products are slow at one-query shapes), elsewhere in
        the model's dtype."""
        first = cast(DecoderLayer, self.decoder[0]).self_attn
        weight = self.output_weight
        dtype = torch.float32 if weight.device.type == "cpu" else weight.dtype
        return DecoderCache.empty(len(self.decoder), dtype, first.h, self.cfg.attention_window)

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: StepCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """One decoding step: (B,) newest tokens -> log-probabilities (B, V) of the next,
        in float32.

        Self-attention keys/values of the prefix come from the cache; cross-attention
        keys/values are computed from `memory` on the first step and reused after.
        With `need_weights`, also this step's attention weights as one flat list of
        row-first tensors (what search records): every decoder layer's self-attention
        (B, h, 1, prefix + 1), then every layer's cross-attention (B, h, 1, S).
        """
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

    def cache_memory(self, memory: Tensor, src_mask: Tensor, cache: StepCache) -> None:
        """Every decoder layer's cross-attention keys/values of `memory` in `cache`: the
        first step's own work, for a step that expects them there already."""
        layer_caches: Sequence[AttentionCache] = cache.layers
        for layer, layer_cache in zip(self.decoder, layer_caches, strict=True):
            if not layer_cache.has_memory():
                attention = cast(DecoderLayer, layer).cross_attn
                layer_cache.store_memory(*attention.project_kv(memory), src_mask)


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters: a tied matrix counts once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def parameter_breakdown(model: Transformer) -> dict[str, int]:
    """Parameters per component; the shared embedding is counted once, under embeddings."""
    seen: set[int] = set()

    def count(*modules: nn.Module | None) -> int:
        total = 0
        for p in (p for m in modules if m is not None for p in m.parameters()):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

    parts = {
        "embeddings": count(model.src_embed, model.tgt_embed),
        "encoder": count(model.encoder, model.encoder_norm),
        "decoder": count(model.decoder, model.decoder_norm),
    }
    parts["total"] = sum(parts.values())
    return parts
