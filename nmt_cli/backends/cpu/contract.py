"""What the Python side hands the compiled step, by name: one table, checked at load.

The C++ step (csrc/decoder_step.cpp), and the encoder it also runs, read every weight and
every cache tensor by name, from the structures below (as dicts) and from the cache
layers' attributes. Each side
keeps one table of those names (`STRUCTURES` here, `kContract` there); `check_contract`
compares them when the module is loaded, so a field added on one side and not the other
stops the compiled step at load, with its name, and decoding stays on the reference step,
instead of reading the wrong tensor at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from types import ModuleType
from typing import Any, ClassVar

from torch import Tensor

from nmt_cli.backends.cpu.slot_cache import SlotLayer
from nmt_cli.core.cache import LayerCache


@dataclass(frozen=True)
class PlainLinearSpec:
    """An `nn.Linear` as it is (fp32 models)."""

    kind: ClassVar[str] = "plain"
    weight: Tensor
    bias: Tensor | None


@dataclass(frozen=True)
class Fp32RowsSpec:
    """backends/cpu/linear.py's Fp32Linear: the weight for many rows (as it is for PyTorch's
    product, or in oneDNN's layout for its own) and the module's layout of it (its AVX2
    kernel for few)."""

    kind: ClassVar[str] = "fp32_rows"
    weight: Tensor
    rows: Tensor
    bias: Tensor | None


@dataclass(frozen=True)
class PackedLinearSpec:
    """backends/cpu/linear.py's PackedLinear: oneDNN's packed bf16 weight, and the module's
    layout of it where its kernel runs (`rows`)."""

    kind: ClassVar[str] = "packed"
    packed: Tensor
    bias: Tensor | None
    rows: Tensor | None
    out_features: int


@dataclass(frozen=True)
class Int8RowsSpec:
    """backends/cpu/linear.py's Int8Linear on the module's per-row kernel."""

    kind: ClassVar[str] = "int8_rows"
    rows: Tensor
    scale: Tensor
    column_sum: Tensor
    bias: Tensor | None
    out_features: int


@dataclass(frozen=True)
class Int8Spec:
    """backends/cpu/linear.py's Int8Linear on PyTorch's quantized kernels (no VNNI): the
    quantized weight, which the C++ side packs again."""

    kind: ClassVar[str] = "int8"
    weight: Tensor
    bias: Tensor | None
    reduce_range: bool


LinearSpec = PlainLinearSpec | Fp32RowsSpec | PackedLinearSpec | Int8RowsSpec | Int8Spec


@dataclass(frozen=True)
class NormSpec:
    weight: Tensor
    bias: Tensor


@dataclass(frozen=True)
class EncoderLayerSpec:
    """One encoder layer (core/transformer.py's EncoderLayer) in its order."""

    self_qkv: LinearSpec
    self_out: LinearSpec
    ffn_w1: LinearSpec
    ffn_w2: LinearSpec
    norm1: NormSpec
    norm2: NormSpec


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer (core/transformer.py's DecoderLayer) in its step's order, and
    the projection of the encoder's output that fills its cross-attention cache."""

    self_qkv: LinearSpec
    self_out: LinearSpec
    cross_q: LinearSpec
    cross_kv: LinearSpec
    cross_out: LinearSpec
    ffn_w1: LinearSpec
    ffn_w2: LinearSpec
    norm1: NormSpec
    norm2: NormSpec
    norm3: NormSpec


@dataclass(frozen=True)
class StepSpec:
    """The whole model as decoding runs it: attention shapes, the embeddings (both scaled
    by `embed_scale`), the encoder's layers, the decoder's, the output projection."""

    heads: int
    d_k: int
    d_v: int
    eps: float
    embed_scale: float
    source_tokens: Tensor
    source_positions: Tensor
    encoder_layers: list[EncoderLayerSpec]
    tokens: Tensor
    positions: Tensor
    projection: LinearSpec
    module_log_softmax: bool  # the module's log-softmax after the projection, or PyTorch's
    layers: list[LayerSpec]


# Per layer, the attributes of each cache layout the step reads every step (and, over
# the reference DecoderCache, writes: self_k, self_v, pending).
PREFIX_STATE = ("self_k", "self_v", "pending", "cross_k", "cross_v", "cross_bias")
SLOT_STATE = ("self_k", "self_v", "cross_k", "cross_v", "cross_bias")


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


STRUCTURES: dict[str, tuple[str, ...]] = {
    "step": _names(StepSpec),
    "encoder_layer": _names(EncoderLayerSpec),
    "layer": _names(LayerSpec),
    "norm": _names(NormSpec),
    **{f"linear.{cls.kind}": _names(cls) for cls in LinearSpec.__args__},
    "cache.prefix": PREFIX_STATE,
    "cache.slots": SLOT_STATE,
}


class ContractError(RuntimeError):
    """The compiled module and this side name different fields; the message says which."""


def contract_differences(theirs: dict[str, list[str]]) -> list[str]:
    """Every field or structure only one side has, as readable phrases."""
    found: list[str] = []
    for structure in sorted(STRUCTURES.keys() | theirs.keys()):
        ours_names, their_names = set(STRUCTURES.get(structure, ())), set(theirs.get(structure, ()))
        found += [f"{structure}.{n} only in Python" for n in sorted(ours_names - their_names)]
        found += [f"{structure}.{n} only in C++" for n in sorted(their_names - ours_names)]
    return found


def check_contract(kernel: ModuleType) -> None:
    """Raise ContractError unless the module reads exactly the fields this side gives."""
    differences = contract_differences(dict(kernel.contract()))
    for name, layout in (("cache.prefix", LayerCache), ("cache.slots", SlotLayer)):
        missing = set(STRUCTURES[name]) - set(_names(layout))
        differences += [f"{name}.{n} is no attribute of {layout.__name__}" for n in sorted(missing)]
    if differences:
        raise ContractError(
            "the compiled step and the Python side disagree: " + "; ".join(differences)
        )


def as_arguments(spec: Any) -> Any:
    """A spec as the C++ side reads it: dataclasses as dicts of their fields (linear
    layers with their `kind`), lists item by item, tensors and numbers as they are."""
    if isinstance(spec, list):
        return [as_arguments(item) for item in spec]
    if is_dataclass(spec):
        out = {f.name: as_arguments(getattr(spec, f.name)) for f in fields(spec)}
        kind = getattr(type(spec), "kind", None)
        if kind is not None:
            out["kind"] = kind
        return out
    return spec
