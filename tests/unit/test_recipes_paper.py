"""The WMT14 recipes carry the paper's numbers (PAPER.md), setting by setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt_cli.config import RecipeConfig, load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _load(name: str) -> RecipeConfig:
    return load_recipe(RECIPES / name)


def _common(cfg: RecipeConfig) -> None:
    m, t, d = cfg.model, cfg.train, cfg.decode
    assert (m.encoder_layers, m.decoder_layers) == (6, 6)
    assert m.head_dim_k == m.head_dim_v == 64
    assert m.positions == "sinusoidal" and m.share_embeddings
    assert t.label_smoothing == 0.1
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps) == (0.9, 0.98, 1e-9)
    assert t.warmup_steps == 4000 and t.lr_scale == 1.0
    assert t.batch_tokens == 25000
    assert t.save_interval_minutes == 10
    assert (d.beam_size, d.length_penalty, d.max_len_a, d.max_len_b) == (4, 0.6, 1.0, 50)
    assert cfg.data.joint_vocab
    assert cfg.score.sacrebleu and cfg.score.paper_bleu


@pytest.mark.parametrize(
    ("name", "preset", "vocab", "size", "dropout", "steps", "average"),
    [
        ("wmt14-en-de-base.toml", "wmt14-en-de", 37000, "base", 0.1, 100_000, 5),
        ("wmt14-en-de-big.toml", "wmt14-en-de", 37000, "big", 0.3, 300_000, 20),
        ("wmt14-en-fr-base.toml", "wmt14-en-fr", 32000, "base", 0.1, 100_000, 5),
        ("wmt14-en-fr-big.toml", "wmt14-en-fr", 32000, "big", 0.1, 300_000, 20),
    ],
)
def test_wmt14_recipes_match_the_paper(
    name: str, preset: str, vocab: int, size: str, dropout: float, steps: int, average: int
) -> None:
    cfg = _load(name)
    _common(cfg)
    assert cfg.data.preset == preset and cfg.data.vocab_size == vocab
    dims = (cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads)
    assert dims == ((512, 2048, 8) if size == "base" else (1024, 4096, 16))
    assert cfg.model.dropout == dropout
    assert cfg.train.max_steps == steps
    assert cfg.decode.average_last == average
    assert cfg.train.keep_last >= average
