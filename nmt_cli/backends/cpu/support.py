"""What the CPU backend's model-shaped parts implement: one declaration, checked per model.

The packed linear layers and the log-softmax are single operations, right for any model.
The compiled step (csrc/decoder_step.cpp, the encoder's layers too) and the SlotCache's
attention kernel are not: they repeat the model's structure (post-norm layers, full
attention, a ReLU feed-forward, the tied projection and its optional bias). Every
setting of core's `ModelConfig` is therefore declared here with the values they
implement, and a model whose settings fall outside (a SiLU or GELU feed-forward, a
restricted attention window, pre-norm layers), or that has a setting this table does
not know (one core gains later), decodes on the reference step, with one notice,
instead of silently computing another model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from nmt_cli.core.model_config import ModelConfig


def _any(value: object) -> bool:
    """Sizes, counts, ids and training-only settings: the kernels take any value."""
    return True


# Setting -> whether the compiled step and the attention kernel implement a value of it.
SUPPORTED: dict[str, Callable[[Any], bool]] = {
    "encoder_layers": _any,
    "decoder_layers": _any,
    "d_model": _any,
    "d_ff": _any,
    "n_heads": _any,
    "d_k": _any,
    "d_v": _any,
    "dropout": _any,  # decoding runs without dropout
    "attention_dropout": _any,
    "relu_dropout": _any,
    "positions": lambda value: value in ("sinusoidal", "learned"),
    "max_positions": _any,
    "src_vocab_size": _any,
    "tgt_vocab_size": _any,
    "pad_id": _any,
    "share_embeddings": _any,  # the projection is the target embedding either way
    "joint_vocab": _any,
    "activation": lambda value: value == "relu",  # the step fuses ReLU into the product
    "output_bias": _any,  # the projection is a linear layer with an optional bias
    "attention_window": lambda value: value == 0,  # the step attends to the whole prefix
    "pre_norm": lambda value: value is False,  # the step normalizes after each residual add
}

PRECISIONS = ("fp32", "bf16", "int8")


def unsupported(cfg: ModelConfig, precision: str) -> list[str]:
    """The settings of `cfg` (and the precision) outside what the compiled step and the
    attention kernel implement, as `name=value` phrases; empty when they decode it."""
    gaps = [] if precision in PRECISIONS else [f"precision={precision}"]
    for item in fields(cfg):
        value = getattr(cfg, item.name)
        check = SUPPORTED.get(item.name)
        if check is None or not check(value):
            gaps.append(f"model.{item.name}={value!r}")
    return gaps
