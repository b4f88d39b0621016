"""What every importer shares: its refusals, the files it reads, the checkpoint it builds.

An importer maps a model trained elsewhere onto nmt's Transformer exactly, or refuses it
with a message that names the difference (`ImportRefused`): never a model that computes
something close. The weights it maps are loaded into a real Transformer with
`load_state_dict(strict=True)`, so a name it forgot or invented fails there, not later.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import DataConfig, RecipeConfig
from nmt_cli.core.checkpoint import Checkpoint, model_state
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair
from nmt_cli.errors import NmtError
from nmt_cli.version import __version__

# nmt starts decoding from <s>; a model that starts from <pad> (Marian) has no such output.
# The imported <s> gets <pad>'s embedding and an output bias this far below <pad>'s: its
# probability is then e^-30 (~1e-13) of <pad>'s, so every other log-probability equals
# the original model's to ~1e-13, while label smoothing, which averages the logits of
# the whole vocabulary, sees an offset of 30 / V (5e-4 per token at V = 58,000).
BOS_BIAS_GAP = 30.0


class ImportRefused(NmtError):
    """A model nmt cannot compute exactly; the message names what differs."""


@dataclass(frozen=True)
class Imported:
    """An imported model, before it is written: the checkpoint and what the import did."""

    checkpoint: Checkpoint
    notes: tuple[str, ...]  # differences handled (and how), shown to the user


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportRefused(f"{path}: missing ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportRefused(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path}: expected a JSON object ({what})")
    return data


def build_checkpoint(
    cfg: ModelConfig,
    vocab: VocabPair,
    weights: dict[str, Tensor],
    languages: tuple[str, str],
    origin: dict[str, Any],
) -> Checkpoint:
    """An inference checkpoint of `weights` (under nmt's names, float32): loaded strictly
    into the Transformer of `cfg`, so every weight is set and none is left over. Its
    recipe records the model and the languages, as a trained checkpoint's does."""
    if len(vocab.src) != cfg.src_vocab_size or len(vocab.tgt) != cfg.tgt_vocab_size:
        raise AssertionError("the vocabularies and the model's sizes disagree")
    model = Transformer(cfg)
    model.load_state_dict({k: v.float().contiguous() for k, v in weights.items()}, strict=True)
    data = DataConfig(src=languages[0], tgt=languages[1], dir="", joint_vocab=vocab.joint)
    recipe = RecipeConfig(name="imported", data=data, model=cfg)
    origin = {**origin, "imported_by": f"nmt {__version__}"}
    return Checkpoint(cfg, vocab, model_state(model), recipe=recipe.to_dict(), origin=origin)


def unpermute(perm: Tensor) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """Functions undoing a permutation P of the d_model axis (theirs = ours[..., P]):
    `rows` for an output (or 1-d) axis, `cols` for an input axis."""
    inverse = torch.argsort(perm)

    def rows(t: Tensor) -> Tensor:
        return t.float()[inverse].contiguous()

    def cols(t: Tensor) -> Tensor:
        return t.float()[:, inverse].contiguous()

    return rows, cols
