"""`nmt average-checkpoints` end to end: exact means, run-directory selection, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.core.checkpoint import load_checkpoint, save_checkpoint
from nmt_cli.core.vocab import VocabPair, train_sentencepiece
from nmt_cli.engines.average import average_checkpoints, select_last
from tests.fixtures.translation_ckpt import random_checkpoint, sentences, tiny_vocab

runner = CliRunner()


@pytest.fixture(scope="module")
def vocab() -> VocabPair:
    return tiny_vocab()


@pytest.fixture
def run_dir(tmp_path: Path, vocab: VocabPair) -> Path:
    ckpts = tmp_path / "run" / "checkpoints"
    for i, step in enumerate((100, 200, 300, 1000)):
        random_checkpoint(ckpts / f"step_{step:08d}.pt", vocab, seed=i, step=step)
    # last.pt (a training checkpoint) and best.pt are never selected by --last.
    last = load_checkpoint(ckpts / "step_00001000.pt")
    last.kind, last.train_state = "train", {"optimizer": {"lr": 0.1}}
    save_checkpoint(last, ckpts / "last.pt")
    random_checkpoint(ckpts / "best.pt", vocab, seed=9, step=200)
    return tmp_path / "run"


def expected_mean(paths: list[Path]) -> dict[str, torch.Tensor]:
    states = [load_checkpoint(p).model for p in paths]
    return {k: (sum(s[k].double() for s in states) / len(states)).float() for k in states[0]}


def test_last_n_of_a_run_directory(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "avg.pt"
    result = runner.invoke(
        app, ["average-checkpoints", str(run_dir), "--last", "3", "-o", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    ckpts = run_dir / "checkpoints"
    chosen = [ckpts / f"step_{s:08d}.pt" for s in (200, 300, 1000)]  # by step, not by name
    avg = load_checkpoint(out)
    want = expected_mean(chosen)
    assert avg.model.keys() == want.keys()
    for key, tensor in want.items():
        assert torch.equal(avg.model[key], tensor), key
    assert avg.kind == "inference" and avg.train_state is None and avg.step == 1000
    assert avg.meta["averaged_from"] == [p.name for p in chosen]
    assert avg.meta["averaged_steps"] == [200, 300, 1000]
    # `nmt translate` loads the result.
    translated = runner.invoke(
        app, ["translate", "-m", str(out), "--max-len-b", "2"], input="a cat\n"
    )
    assert translated.exit_code == 0 and translated.stdout.count("\n") == 1


def test_selection_ignores_last_and_best(run_dir: Path) -> None:
    assert [p.name for p in select_last(run_dir, 2)] == ["step_00000300.pt", "step_00001000.pt"]
    assert len(select_last(run_dir / "checkpoints", 10)) == 4


def test_explicit_checkpoints_and_a_training_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    ckpts = run_dir / "checkpoints"
    paths = [ckpts / "step_00000100.pt", ckpts / "last.pt"]
    result = average_checkpoints(paths, tmp_path / "two.pt")
    assert result.steps == [100, 1000]
    avg = load_checkpoint(tmp_path / "two.pt")
    for key, tensor in expected_mean(paths).items():
        assert torch.equal(avg.model[key], tensor)


def test_fewer_checkpoints_than_asked_warns(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "avg.pt"
    result = runner.invoke(
        app, ["average-checkpoints", str(run_dir), "--last", "20", "-o", str(out)]
    )
    assert result.exit_code == 0
    assert "only 4 step checkpoint(s)" in result.stderr
    assert load_checkpoint(out).meta["averaged_count"] == 4


def test_refuses_different_architectures(run_dir: Path, tmp_path: Path, vocab: VocabPair) -> None:
    other = random_checkpoint(tmp_path / "wide.pt", vocab, d_model=48)
    first = run_dir / "checkpoints" / "step_00000100.pt"
    result = runner.invoke(
        app, ["average-checkpoints", str(first), str(other), "-o", str(tmp_path / "x.pt")]
    )
    one_error(result, 1, "different architectures (model.d_ff: 64 vs 96")
    assert not (tmp_path / "x.pt").exists()


def test_refuses_different_vocabularies(run_dir: Path, tmp_path: Path) -> None:
    proto = train_sentencepiece([s.upper() for s in sentences(300, seed=4)], vocab_size=48)
    other = random_checkpoint(tmp_path / "v.pt", VocabPair.from_protos(proto, proto))
    first = run_dir / "checkpoints" / "step_00000100.pt"
    result = runner.invoke(
        app, ["average-checkpoints", str(first), str(other), "-o", str(tmp_path / "x.pt")]
    )
    one_error(result, 1, "different src vocabularies")


def test_bad_inputs_are_clear_errors(run_dir: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "x.pt")
    cases = [
        (["average-checkpoints", str(tmp_path / "nope.pt"), "-o", out], "no such checkpoint", 1),
        (["average-checkpoints", str(run_dir), "-o", out], "needs --last", 2),
        (
            ["average-checkpoints", str(tmp_path), "--last", "2", "-o", out],
            "no step checkpoints",
            1,
        ),
    ]
    for args, message, code in cases:
        one_error(runner.invoke(app, args), code, message)
    corrupt = tmp_path / "bad.pt"
    corrupt.write_bytes(b"not a checkpoint")
    result = runner.invoke(app, ["average-checkpoints", str(corrupt), "-o", out])
    one_error(result, 1, "bad.pt")
