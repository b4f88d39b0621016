"""`nmt train` end to end on tiny data: train, resume, refuse a changed model, stop on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.core.checkpoint import load_checkpoint
from tests.fixtures.train_data import make_data_dir, wait_for_updates

runner = CliRunner()


def write_recipe(tmp_path: Path, data: Path, run: Path, steps: int) -> Path:
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(
        f"""
name = "tiny"
[data]
dir = "{data}"
[model]
encoder_layers = 1
decoder_layers = 1
d_model = 32
d_ff = 64
n_heads = 4
max_positions = 64
[train]
run_dir = "{run}"
batch_tokens = 240
max_tokens = 120
warmup_steps = 4
max_steps = {steps}
save_interval_steps = 2
log_interval_steps = 1
precision = "fp32"
threads = 1
""",
        encoding="utf-8",
    )
    return recipe


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    data = make_data_dir(tmp_path / "data")
    return write_recipe(tmp_path, data, tmp_path / "run", steps=4), tmp_path / "run"


def test_train_resume_and_refuse_a_changed_model(setup: tuple[Path, Path]) -> None:
    recipe, run = setup
    first = runner.invoke(app, ["train", str(recipe)])
    assert first.exit_code == 0, first.output
    text = " ".join(first.output.split())
    assert re.search(
        r"about 240 real tokens per update = 1 device\(s\) x 3 accumulation "
        r"step\(s\) x \d+ padded tokens \(\d+% real\)",
        text,
    )
    assert re.search(r"first updates: \d+ source / \d+ target tokens", text)
    assert "training summary" in first.output
    assert "plan:" not in first.output  # the plan of operations: --verbose only
    assert "plan: loss_sweep: " in (run / "train.log").read_text()  # and always in the log
    assert (run / "checkpoints/step_00000004.pt").is_file()
    assert load_checkpoint(run / "checkpoints/last.pt").step == 4

    again = runner.invoke(app, ["train", str(recipe), "--set", "train.max_steps=6", "-v"])
    assert again.exit_code == 0, again.output
    assert "resuming at step 4" in again.output
    plan = [line for line in again.output.splitlines() if line.startswith("plan: ")]
    assert [line.split(":")[1].strip() for line in plan] == [
        "attention",
        "biased_attention",
        "blocks",
        "keep_mask",
        "dropout_add",
        "loss_sweep",
        "linear",
        "dense_relu",
    ]
    assert load_checkpoint(run / "checkpoints/last.pt").step == 6

    changed = runner.invoke(app, ["train", str(recipe), "--set", "model.n_heads=2"])
    one_error(changed, 1, "cannot resume", "model.n_heads: 4 vs 2")


def test_run_dir_option_and_cpu_only_errors(setup: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, _ = setup
    other = tmp_path / "elsewhere"
    ok = runner.invoke(
        app, ["train", str(recipe), "--run-dir", str(other), "--set", "train.max_steps=1"]
    )
    assert ok.exit_code == 0, ok.output
    assert (other / "checkpoints/last.pt").is_file()
    both = runner.invoke(app, ["train", str(recipe), "--gpus", "1", "--procs", "2"])
    one_error(both, 1, "--procs is for CPU training")
    fp16 = runner.invoke(app, ["train", str(recipe), "--set", "train.precision=fp16"])
    one_error(fp16, 1, "fp16", "needs a GPU")


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_and_exits_128_plus_its_number(
    tmp_path: Path, signum: int, code: int
) -> None:
    """Saved and stopped, but not finished: 130 or 143, so `nmt train ... && next` stops."""
    data = make_data_dir(tmp_path / "data")
    recipe = write_recipe(tmp_path, data, tmp_path / "run", steps=100_000)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "train", str(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    wait_for_updates(tmp_path / "run", 5, within_s=60)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err.decode()
    assert "interrupted: saved checkpoints/last.pt" in err.decode()
    last_line = err.decode().rstrip().splitlines()[-1]
    assert last_line.startswith(f"error: training stopped by signal {int(signum)}")
    assert out == b""  # no checkpoint path for a script to take as the result
    last = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert last.step >= 5
    assert not (tmp_path / "run/train.lock").exists()


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path, data, run, steps=100_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "train", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Step checkpoints are written before last.pt, so once step 6 exists, last.pt holds at
    # least step 4 (whatever moment the kill lands in).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run / "checkpoints/step_00000006.pt").is_file():
        time.sleep(0.1)
    proc.kill()  # SIGKILL: no chance to save or to remove the lock
    proc.wait()
    assert (run / "train.lock").is_file()
    saved = load_checkpoint(run / "checkpoints/last.pt").step  # readable, never torn
    assert saved >= 4
    again = runner.invoke(app, ["train", str(recipe), "--set", f"train.max_steps={saved + 2}"])
    assert again.exit_code == 0, again.output
    assert f"resuming at step {saved}" in " ".join(again.output.split())
    assert load_checkpoint(run / "checkpoints/last.pt").step == saved + 2


def test_separate_vocabularies_of_equal_size_train_separate_embeddings(tmp_path: Path) -> None:
    """Section 3.4's three-way tie needs one vocabulary: with two SentencePiece models of
    the same size the source embedding must still be its own matrix."""
    from tests.fixtures.train_data import pairs

    for split, n, seed in (("train", 200, 1), ("valid", 12, 2)):
        items = pairs(n, seed)
        (tmp_path / f"{split}.en").write_text("".join(a + "\n" for a, _ in items))
        (tmp_path / f"{split}.de").write_text("".join(b.upper() + "\n" for _, b in items))
    data = tmp_path / "data"
    prepared = runner.invoke(
        app,
        [
            "prepare",
            *("--train-src", str(tmp_path / "train.en"), "--train-tgt", str(tmp_path / "train.de")),
            *("--valid-src", str(tmp_path / "valid.en"), "--valid-tgt", str(tmp_path / "valid.de")),
            *("--src", "en", "--tgt", "de", "--out", str(data), "--vocab-size", "40"),
            "--separate-vocab",
        ],
    )
    assert prepared.exit_code == 0, prepared.output
    recipe = write_recipe(tmp_path, data, tmp_path / "run", steps=2)
    assert runner.invoke(app, ["train", str(recipe)]).exit_code == 0
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ckpt.model_config.src_vocab_size == ckpt.model_config.tgt_vocab_size == 40
    assert not ckpt.model_config.joint_vocab and not ckpt.vocab.joint
    model = ckpt.build_model()
    src, tgt = model.src_embed.tokens.weight, model.tgt_embed.tokens.weight
    assert src is not tgt and not src.equal(tgt)
    assert model.output_weight is tgt
