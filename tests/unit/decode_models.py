"""Small random models as `nmt translate` builds them for each precision, for the tests
of the CPU decoding backend: its compiled step and the caches it decodes over."""

from __future__ import annotations

from types import ModuleType

import torch

from nmt_cli.backends.cpu.decoder import CpuDecoder
from nmt_cli.backends.cpu.linear import specialise_linears
from nmt_cli.core.transformer import ModelConfig, Transformer

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
    **overrides: object,
) -> CpuDecoder:
    """A random model wrapped as the backend wraps it for `precision` (cpu_decoders):
    its layers on `kernel`'s products when given, the Python step unless `compiled`."""
    return wrap(random_model(seed, **overrides), precision, kernel, compiled)


def wrap(
    model: Transformer,
    precision: str,
    kernel: ModuleType | None = None,
    compiled: bool = False,
    structural: bool = True,
) -> CpuDecoder:
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    kind = {"bf16": "packed-bf16", "int8": "int8"}.get(precision)
    projection = specialise_linears(model, kind, kernel) if kind else None  # type: ignore[arg-type]
    return CpuDecoder(model, projection, kernel, structural, compiled)
