"""Small random models as `nmt translate` builds them for each precision, for the tests
of the compiled step and the caches it decodes over."""

from __future__ import annotations

from types import ModuleType

import torch

from nmt_cli.core.decode_linear import specialise_linears
from nmt_cli.core.transformer import ModelConfig, Transformer


def decode_model(
    precision: str, kernel: ModuleType | None = None, seed: int = 0, **overrides: object
) -> Transformer:
    """A random model as build_decoder makes it for `precision`; the bf16 linear layers
    use `kernel`'s few-row products when given, as they do beside the compiled step."""
    torch.manual_seed(seed)
    settings: dict[str, object] = dict(
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
    settings.update(overrides)
    model = Transformer(ModelConfig(**settings)).eval()  # type: ignore[arg-type]
    if precision == "bf16":
        model = model.to(torch.bfloat16)
        specialise_linears(model, "packed-bf16", kernel)
    elif precision == "int8":
        specialise_linears(model, "int8", kernel)
    return model
