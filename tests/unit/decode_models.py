"""Small random models as `nmt translate` builds them for each precision, for the tests
of the CPU decoding backend: its compiled step and the caches it decodes over."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import cast

import torch

from nmt_cli.backends.cpu.decoder import CpuDecoder, output_projection
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.attention import Attention
from nmt_cli.core.checkpoint import build_transformer
from nmt_cli.core.operations import REFERENCE, Operations
from nmt_cli.core.precision import DecodePrecision, dtype_of
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.engines.models import decoding_models

SETTINGS: dict[str, object] = dict(
    encoder_layers=1,
    decoder_layers=2,
    d_model=32,
    d_ff=64,
    n_heads=4,
    dropout=0.0,
    src_vocab_size=50,
    tgt_vocab_size=50,
    max_positions=40,
)


def random_model(seed: int = 0, **overrides: object) -> Transformer:
    """The core model itself, float32: the reference."""
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**SETTINGS, **overrides})).eval()  # type: ignore[arg-type]


def decode_model(
    precision: str,
    kernel: ModuleType | None = None,
    seed: int = 0,
    compiled: bool = False,
    attention: Attention | None = None,
    **overrides: object,
) -> CpuDecoder:
    """A random model wrapped as the backend wraps it for `precision` (cpu_decoders):
    its layers on `kernel`'s products when given, the Python step unless `compiled`,
    core's reference attention unless `attention` is given."""
    return wrap(random_model(seed, **overrides), precision, kernel, compiled, attention=attention)


def wrap(
    model: Transformer,
    precision: str,
    kernel: ModuleType | None = None,
    compiled: bool = False,
    structural: bool = True,
    attention: Attention | None = None,
) -> CpuDecoder:
    """`model`'s weights built with the linear layers the planner chooses for decoding in
    `precision` on a CPU with `kernel` (None: without the compiled module), and wrapped;
    its other operations stay core's references (`attention` replaces that one), as
    `model`'s, which is not changed."""
    target = Target(torch.device("cpu"), False, kernel=kernel, precision=precision)
    operations = replace(REFERENCE, linear=machine_plan(target).operations.linear)
    if attention is not None:
        operations = replace(operations, attention=attention)
    built = build_transformer(model.cfg, model.state_dict(), operations)
    built = built.to(dtype_of(cast(DecodePrecision, precision)))
    projection = output_projection(built, operations.linear)
    return CpuDecoder(built, projection, kernel, structural, compiled)


def backend_decoder(
    model: Transformer, precision: str, on_fallback: Callable[[str], None]
) -> CpuDecoder:
    """`model`'s weights decoded as `nmt translate` decodes a checkpoint's: the compiled
    module (built if need be), the plan's linear layers and the backend's choices
    (`decoding_models`); its other operations stay core's references, as in `wrap`."""

    def build(operations: Operations) -> Transformer:
        with_linears = replace(REFERENCE, linear=operations.linear)
        return build_transformer(model.cfg, model.state_dict(), with_linears)

    precision_ = cast(DecodePrecision, precision)
    [decoder], _ = decoding_models(
        [build], torch.device("cpu"), precision_, True, None, on_fallback
    )
    return cast(CpuDecoder, decoder)
