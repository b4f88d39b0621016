"""Pre-norm models (`model.pre_norm`) through the commands: `nmt train` trains one from
a recipe override, and `nmt translate` decodes one on the reference step whether or not
the compiled (post-norm) step is available, with one notice saying why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from test_train_cli import write_recipe
from typer.testing import CliRunner
from unix_helpers import no_escape

from nmt_cli.cli import app
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint
from nmt_cli.core.transformer import Transformer
from tests.fixtures.train_data import make_data_dir
from tests.fixtures.translation_ckpt import COPY_POOL, tiny_config, tiny_vocab

runner = CliRunner()


def test_translate_decodes_a_pre_norm_model_on_the_reference_step(tmp_path: Path) -> None:
    vocab = tiny_vocab()
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(tiny_config(vocab), pre_norm=True))
    path = save_checkpoint(Checkpoint(model.cfg, vocab, model_state(model)), tmp_path / "p.pt")
    args = ["translate", "-m", str(path), "--precision", "fp32", "--alignment"]
    text = "\n".join(COPY_POOL[:8]) + "\n"
    compiled = runner.invoke(app, args, input=text)
    python = runner.invoke(app, [*args, "--python-step"], input=text)
    for result in (compiled, python):
        no_escape(result)
        assert result.exit_code == 0, result.output
    assert "does not implement model.pre_norm=True" in compiled.stderr
    assert "pre_norm" not in python.stderr
    assert compiled.stdout == python.stdout and len(compiled.stdout.splitlines()) == 8


def test_train_trains_a_pre_norm_model(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    recipe = write_recipe(tmp_path, data, tmp_path / "run", steps=2)
    result = runner.invoke(app, ["train", str(recipe), "--set", "model.pre_norm=true"])
    no_escape(result)
    assert result.exit_code == 0, result.output
    ckpt = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert ckpt.model_config.pre_norm and ckpt.step == 2
    assert {"encoder_norm.weight", "decoder_norm.bias"} <= set(ckpt.model)
    assert all(torch.isfinite(w).all() for w in ckpt.model.values())
