"""Parameter counts of a model, as `nmt train` and the run summary report them."""

from __future__ import annotations

from torch import nn

from nmt_cli.core.transformer import Transformer


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
