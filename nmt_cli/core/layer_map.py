"""The Transformer's parameters by role, the one map of core/transformer.py's state dict:
the conversions to and from other toolkits and the compiled decoder step walk it and keep
only their own names for each role. A layer is a sequence of sublayers (residual blocks),
each a module of linear layers plus the LayerNorm that belongs to it; a fused projection
names the projections stacked in its rows, which `split` takes apart and `join` stacks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from nmt_cli.core.model_config import ModelConfig

Kind = Literal["weight", "bias"]
KINDS: tuple[Kind, ...] = ("weight", "bias")  # what every linear layer and LayerNorm holds
Axis = Literal["rows", "cols", "none"]


@dataclass(frozen=True)
class Linear:
    """`parts`: the projections in its rows, in order (itself when not fused);
    `reads_stream`: its input is d_model wide (the stream or the encoder's output), else
    its output is."""

    name: str
    parts: tuple[str, ...]
    reads_stream: bool


@dataclass(frozen=True)
class Sublayer:
    """A residual block: the layer's attributes holding its linears and its LayerNorm."""

    module: str
    linears: tuple[Linear, ...]
    norm: str


@dataclass(frozen=True)
class Role:
    """A linear layer (or, `linear` None, the LayerNorm) of a sublayer of layer `index`."""

    stack: Stack
    index: int
    sublayer: Sublayer
    linear: Linear | None

    @property
    def name(self) -> str:
        """The module's name in the model (its tensors: `name`.weight and `name`.bias)."""
        sub = self.sublayer
        module = sub.norm if self.linear is None else f"{sub.module}.{self.linear.name}"
        return f"{self.stack.side}.{self.index}.{module}"

    @property
    def parts(self) -> tuple[str, ...]:
        """What `split` takes the module's tensors into (a norm: itself)."""
        return (self.sublayer.norm,) if self.linear is None else self.linear.parts

    def axis(self, kind: Kind) -> Axis:
        """Where the tensor's d_model axis lies: its output axis ("rows", or a 1-d tensor),
        its input axis ("cols"), or none (a bias of a projection out of d_model)."""
        if self.linear is not None and self.linear.reads_stream:
            return "cols" if kind == "weight" else "none"
        return "rows"


@dataclass(frozen=True)
class Stack:
    """One side: layers `side`.i, embedding module, LayerNorm after the last layer (pre-norm)."""

    side: Literal["encoder", "decoder"]
    embed: str
    sublayers: tuple[Sublayer, ...]
    final_norm: str

    @property
    def tokens(self) -> str:
        return f"{self.embed}.tokens.weight"

    @property
    def positions(self) -> str:  # learned only: sinusoids are not in the state dict
        return f"{self.embed}.learned.weight"

    def roles(self, index: int) -> Iterator[Role]:
        for sub in self.sublayers:
            for linear in (*sub.linears, None):
                yield Role(self, index, sub, linear)


_OUT = Linear("out", ("out",), reads_stream=False)
_SELF = Sublayer("self_attn", (Linear("qkv", ("q", "k", "v"), True), _OUT), "norm1")
_CROSS_IN = (Linear("q", ("q",), True), Linear("kv", ("k", "v"), True))
_CROSS = Sublayer("cross_attn", (*_CROSS_IN, _OUT), "norm2")
_FFN = (Linear("w1", ("w1",), True), Linear("w2", ("w2",), reads_stream=False))
ENCODER = Stack("encoder", "src_embed", (_SELF, Sublayer("ffn", _FFN, "norm2")), "encoder_norm")
DECODER = Stack(
    "decoder", "tgt_embed", (_SELF, _CROSS, Sublayer("ffn", _FFN, "norm3")), "decoder_norm"
)
STACKS = (ENCODER, DECODER)
OUTPUT_BIAS = "output_bias"  # the output projection's bias (model.output_bias only)


def roles(cfg: ModelConfig) -> Iterator[Role]:
    """Every layer's linear layers and norms, the encoder's first."""
    for stack, layers in ((ENCODER, cfg.encoder_layers), (DECODER, cfg.decoder_layers)):
        for index in range(layers):
            yield from stack.roles(index)


def parameter_names(cfg: ModelConfig) -> list[str]:
    """The state dict's names of a Transformer(cfg), each once; a tied embedding matrix
    is there under each of its names, as `state_dict` lists it."""
    names = [stack.tokens for stack in STACKS]
    if cfg.positions == "learned":
        names += [stack.positions for stack in STACKS]
    names += [f"{role.name}.{kind}" for role in roles(cfg) for kind in KINDS]
    if cfg.pre_norm:
        names += [f"{stack.final_norm}.{kind}" for stack in STACKS for kind in KINDS]
    return [*names, OUTPUT_BIAS] if cfg.output_bias else names


def split(fused: Tensor, parts: Sequence[str], cfg: ModelConfig) -> tuple[Tensor, ...]:
    """A fused projection's weight or bias as its parts' ([Q; K; V] or [K; V] rows: h
    heads of d_k each for q and k, of d_v for v)."""
    if len(parts) == 1:
        return (fused,)
    qk, v = cfg.n_heads * cfg.head_dim_k, cfg.n_heads * cfg.head_dim_v
    return tuple(fused.split([{"q": qk, "k": qk, "v": v}[part] for part in parts]))


def join(parts: Sequence[Tensor]) -> Tensor:
    """The inverse of `split`: the parts stacked in their order."""
    return torch.cat(list(parts))
