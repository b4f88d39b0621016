"""Build a recipe's model without data and describe it (what `nmt train --dry-run` shows)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from nmt_cli.config import RecipeConfig
from nmt_cli.core.parameters import parameter_breakdown
from nmt_cli.core.transformer import ModelConfig, Transformer


@dataclass(frozen=True)
class ModelSummary:
    config: ModelConfig
    parameters: dict[str, int]  # embeddings, encoder, decoder, total


def summarize_model(
    recipe: RecipeConfig, src_vocab: int, tgt_vocab: int | None = None
) -> ModelSummary:
    """Instantiate the recipe's model for the given vocabulary sizes and count parameters."""
    cfg = dataclasses.replace(
        recipe.model, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab or src_vocab
    )
    # On the meta device nothing is allocated: a big model is described in milliseconds.
    with torch.device("meta"):
        model = Transformer(cfg)
    return ModelSummary(config=cfg, parameters=parameter_breakdown(model))
