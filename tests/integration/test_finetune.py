"""Fine-tuning from any checkpoint: `nmt prepare --vocab-from` encodes a new corpus with
an imported model's own vocabulary, `nmt train --init` starts from its weights (fresh
optimizer and schedule, the recipe's dropout), from its dev loss rather than a random
model's, lowers it, resumes like any run, and refuses a recipe or data that contradicts
the checkpoint. The model is a small copying Transformer sent through `nmt export --to
huggingface` and `nmt import`, so what is fine-tuned is an imported checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from unix_helpers import no_escape

from nmt_cli.cli import app
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.transformer import Transformer
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.train.validate import DevSet, dev_loss
from tests.fixtures.translation_ckpt import sentences

pytest.importorskip("transformers")
runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    no_escape(result)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, copy_model: Path) -> dict[str, Path]:
    """The imported model, an in-domain corpus prepared with its vocabulary, a recipe."""
    root = tmp_path_factory.mktemp("finetune")
    invoke("export", str(copy_model), str(root / "hf"), "--to", "huggingface", "-q")
    invoke("import", "--from", "huggingface", str(root / "hf"), "-o", str(root / "m.pt"), "-q")
    corpus = root / "corpus"
    corpus.mkdir()
    for split, lines in (("train", sentences(300, seed=11)), ("valid", sentences(40, seed=12))):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = root / "data"
    invoke("prepare", "--from", str(corpus), "--src", "en", "--tgt", "de", "--out", str(data),
           "--vocab-size", "60", "-q")  # fmt: skip
    invoke(
        "prepare", "--from", str(corpus), "--src", "en", "--tgt", "de", "--out",
        str(root / "mine"), "--vocab-from", str(root / "m.pt"), "-q",
    )  # fmt: skip
    recipe = root / "tune.toml"
    recipe.write_text(
        f"""
name = "tune"
[data]
dir = "{root / "mine"}"
[model]
dropout = 0.0
[train]
batch_tokens = 400
warmup_steps = 10
lr_scale = 0.5
max_steps = 20
save_interval_steps = 10
log_interval_steps = 1
precision = "fp32"
threads = 1
tensorboard = false
""",
        encoding="utf-8",
    )
    return {"model": root / "m.pt", "data": root / "mine", "other": data, "recipe": recipe}


def _dev_loss(model: Transformer, data: Path) -> float:
    prepared = open_data_dir(data)
    src, tgt = prepared.split("valid")
    return dev_loss(model, DevSet(src, tgt, 2000), 0.1, "fp32", torch.device("cpu"))[0]


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("type") == kind]


def test_prepare_encodes_with_the_models_own_vocabulary(setup: dict[str, Path]) -> None:
    model = load_checkpoint(setup["model"])
    data = open_data_dir(setup["data"])
    assert data.vocab.src.model_proto == model.vocab.src.model_proto
    assert data.vocab.joint == model.vocab.joint
    assert data.manifest["settings"]["vocab_from"] == str(setup["model"].resolve())
    both = ["--vocab-from", str(setup["model"]), "--vocab-size", "100"]
    refused = runner.invoke(app, ["prepare", "--from", "x", "--src", "en", "--out", "y", *both])
    no_escape(refused)
    assert refused.exit_code == 2 and "drop --vocab-size" in refused.output


def test_fine_tuning_starts_from_the_checkpoint_and_lowers_its_dev_loss(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    start = load_checkpoint(setup["model"])
    initial = _dev_loss(start.build_model(), setup["data"])
    torch.manual_seed(0)
    random = _dev_loss(Transformer(start.model_config).eval(), setup["data"])
    run = tmp_path / "run"
    tune = ["train", str(setup["recipe"]), "--init", str(setup["model"])]
    tune += ["--set", f"train.run_dir={run}"]
    out = invoke(*tune, "--set", "train.max_steps=10")
    assert "fine-tuning from" in out
    first = _records(run, "train")[0]
    assert first["step"] == 1
    # the first update's loss is the starting weights' (nothing has changed them yet)
    assert first["loss"] < initial + 0.5 < random
    assert "resuming at step 10" in invoke(*tune)  # a fine-tuning run resumes as any run
    dev = [r["dev_loss"] for r in _records(run, "valid")]
    assert len(dev) == 2 and dev[-1] < dev[0] < initial
    tuned = load_checkpoint(run / "checkpoints/last.pt")
    assert tuned.step == 20 and tuned.model_config == start.model_config
    assert tuned.origin is not None and tuned.origin["init_from"] == str(setup["model"])
    assert tuned.origin["origin"]["imported_from"] == "huggingface-marian"


def test_a_contradicting_recipe_or_vocabulary_is_refused(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    train = ["train", str(setup["recipe"]), "--set", f"train.run_dir={tmp_path / 'r'}"]
    init = ["--init", str(setup["model"])]
    cases = [
        ([*init, "--set", "model.d_model=128"], "model.d_model = 128 (the checkpoint's is 64)"),
        ([*init, "--set", f"data.dir={setup['other']}"], "--vocab-from"),
        (["--set", "train.init_from=missing.pt"], "missing.pt: no such checkpoint"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, [*train, *extra])
        no_escape(result)
        assert result.exit_code == 1 and message in result.output, result.output
        assert not (tmp_path / "r" / "checkpoints" / "last.pt").exists()
