"""The decoder step as one call into the compiled module (csrc/decoder_step.cpp).

At a few rows (one sentence, beam 4) a decoder step is a few hundred operator calls of a
few microseconds each, and calling each one from Python costs about as much again. The
C++ step makes the same ATen calls, and the same kernel calls, in the same order as the
reference step (core/transformer.py with backends/cpu/decoder.py's projection), so its
outputs are bit-identical; it is tested against that step, never trusted by itself.
It receives the model as named structures (backends/cpu/contract.py) holding references
to the model's weights and their packed forms, not copies.
"""

from __future__ import annotations

from dataclasses import fields
from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn

from nmt_cli.backends.cpu.contract import (
    EncoderLayerSpec,
    Fp32RowsSpec,
    Int8RowsSpec,
    Int8Spec,
    LayerSpec,
    LinearSpec,
    NormSpec,
    PackedLinearSpec,
    PlainLinearSpec,
    StepSpec,
    as_arguments,
    check_contract,
)
from nmt_cli.backends.cpu.linear import Fp32Linear, Int8Linear, PackedLinear
from nmt_cli.backends.cpu.slot_cache import SlotCache
from nmt_cli.core.cache import DecoderCache
from nmt_cli.core.embedding import Embedding
from nmt_cli.core.layer_map import DECODER, ENCODER, Stack
from nmt_cli.core.norm import LayerNorm
from nmt_cli.core.open_sentence import Ended, OpenSentence
from nmt_cli.core.transformer import DecoderLayer, Transformer


def linear_spec(layer: nn.Module) -> LinearSpec:
    """How the C++ step calls a linear layer: what backends/cpu/linear.py made of it."""
    if isinstance(layer, Fp32Linear):
        return Fp32RowsSpec(layer.weight, layer.rows, layer.bias)
    if isinstance(layer, PackedLinear):
        return PackedLinearSpec(layer.packed, layer.bias, layer.rows, layer.out_features)
    if isinstance(layer, Int8Linear):
        if layer.kernel is not None:
            return Int8RowsSpec(
                layer.rows, layer.scale, layer.column_sum, layer.bias, layer.out_features
            )
        weight, bias = torch.ops.quantized.linear_unpack(layer.packed)
        return Int8Spec(weight, bias, layer.reduce_range)
    if isinstance(layer, nn.Linear):
        return PlainLinearSpec(layer.weight, layer.bias)
    raise TypeError(f"no compiled form of {type(layer).__name__}")


# The specs' name of each sublayer's linear layers: `{prefix}_{linear}`, as in self_qkv.
_PREFIXES = {"self_attn": "self", "cross_attn": "cross", "ffn": "ffn"}


def _layer_fields(model: Transformer, stack: Stack, index: int) -> dict[str, Any]:
    """Layer `index` of `stack` as the C++ side reads it: the layer map's roles, by
    name, each a LinearSpec or a NormSpec."""
    fields: dict[str, Any] = {}
    for role in stack.roles(index):
        module = model.get_submodule(role.name)
        if role.linear is None:
            norm = cast(LayerNorm, module)
            fields[role.sublayer.norm] = NormSpec(norm.weight, norm.bias)
        else:
            fields[f"{_PREFIXES[role.sublayer.module]}_{role.linear.name}"] = linear_spec(module)
    return fields


def _positions(embed: Embedding) -> Tensor:
    return embed.learned.weight if embed.learned is not None else embed.get_buffer("table")


def step_spec(
    model: Transformer, projection: nn.Module | None, module_log_softmax: bool
) -> StepSpec:
    """The model's encoder and decoder step as the C++ side reads them; `projection` is
    the decode-only output projection (None: the tied embedding matrix as it is)."""
    embed = model.tgt_embed
    first = cast(DecoderLayer, model.decoder[0])
    return StepSpec(
        heads=first.self_attn.h,
        d_k=first.self_attn.d_k,
        d_v=first.self_attn.d_v,
        eps=first.norm1.eps,
        embed_scale=embed.scale,  # the source embedding's too (both are sqrt(d_model))
        source_tokens=model.src_embed.tokens.weight,
        source_positions=_positions(model.src_embed),
        encoder_layers=[
            EncoderLayerSpec(**_layer_fields(model, ENCODER, i)) for i in range(len(model.encoder))
        ],
        tokens=embed.tokens.weight,
        positions=_positions(embed),
        projection=(
            linear_spec(projection)
            if projection is not None
            else PlainLinearSpec(model.output_weight, model.output_bias)
        ),
        module_log_softmax=module_log_softmax,
        layers=[LayerSpec(**_layer_fields(model, DECODER, i)) for i in range(len(model.decoder))],
    )


class CompiledStep:
    """The reference step without attention weights, as one call into the module, over
    either cache layout; the encoder, and the SlotCache's cross-attention keys and
    values, as one call each. The cross-attention cache must be filled before the first
    step (CpuDecoder._cache_memory)."""

    def __init__(
        self,
        model: Transformer,
        projection: nn.Module | None,
        kernel: ModuleType,
        module_log_softmax: bool,
    ) -> None:
        check_contract(kernel)
        spec = step_spec(model, projection, module_log_softmax)
        self.kernel = kernel.DecoderStep(as_arguments(spec))

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """Transformer.encode at inference, as one call (PyTorch's fused attention, which
        the CPU plan gives decoding, and the layers' fused ReLU and residual add)."""
        return cast(Tensor, self.kernel.encode(src, src_mask))

    def cache_memory(self, memory: Tensor, src_mask: Tensor, cache: SlotCache) -> None:
        """Every decoder layer's cross-attention keys and values of `memory` stored in
        `cache` as its layers' `store_memory` would, in one call."""
        self.kernel.cache_memory(memory, src_mask, cache.layers, cache.table.dtype)
        if cache.table.sources is None:
            cache.table.sources = torch.arange(memory.size(0))

    def __call__(
        self, tokens: Tensor, cache: DecoderCache | SlotCache, log_probs: bool = True
    ) -> Tensor:
        """(B,) newest tokens -> log-probabilities (B, V) (`log_probs=False`: the output
        layer's logits, as its product gives them); the cache advances one position."""
        if isinstance(cache, SlotCache):
            slots = cache.prepare(tokens.size(0))
            sources = cache.table.sources
            out = self.kernel.step_slots(
                tokens, cache.length, cache.layers, slots, sources, log_probs
            )
        else:
            out = self.kernel.step(tokens, cache.length, cache.layers, log_probs)
        cache.length += 1
        return cast(Tensor, out)

    def finish_sentence(
        self, sentence: OpenSentence, cache: SlotCache, eos: int, banned: list[int]
    ) -> list[Ended] | None:
        """The rest of a one-sentence search (core/open_sentence.py) as one call: each
        step with the fused log-softmax and choice (`banned` ids never chosen) and
        search's own rules, over the slot cache; None where its buffers would have to
        grow on the way (they are made for the search's length limit when it says)."""
        table = cache.table
        slots = cache.prepare(sentence.beam)  # the buffers' room for k rows, now
        if table.steps <= sentence.limit:
            return None
        assert cache.length == sentence.step, "the cache holds every step before this one"
        state = {field.name: getattr(sentence, field.name) for field in fields(sentence)}
        ended, position, slots = self.kernel.finish_sentence(
            **state, layers=cache.layers, slots=slots, sources=table.sources, eos=eos,
            banned=banned,
        )  # fmt: skip
        table.slots, table.length, table.prepared = slots, position, position - 1
        return [Ended(*hypothesis) for hypothesis in ended]
