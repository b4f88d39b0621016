"""`nmt run`: the whole chain on a tiny slice of the demo corpus, and its resumption."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sacrebleu
from typer.testing import CliRunner
from unix_helpers import one_error, snapshot

from nmt_cli.cli import app

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()


def _args(tmp_path: Path, *extra: str) -> list[str]:
    settings = [
        f"data.dir={tmp_path / 'data'}",
        f"train.run_dir={tmp_path / 'run'}",
        "data.max_pairs=400",
        "data.vocab_size=120",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.n_heads=2",
        "train.batch_tokens=600",
        "train.max_steps=4",
        "train.save_interval_steps=2",
        "train.max_time_minutes=0",
        "train.precision='fp32'",
        "decode.average_last=2",
        "decode.max_len_b=5",
    ]
    return ["run", str(RECIPES / "demo.toml"), *[f"--set={s}" for s in settings], *extra]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One finished run for the module, never changed: each test takes a copy (and no
    copy reaches back into it, which the end of the module checks)."""
    tmp_path = tmp_path_factory.mktemp("run")
    result = runner.invoke(app, _args(tmp_path))
    assert result.exit_code == 0, result.output
    before = snapshot(tmp_path)
    yield tmp_path
    assert snapshot(tmp_path) == before


@pytest.fixture
def finished_run(shared_run: Path, tmp_path: Path) -> Path:
    """This test's copy of the finished run (data and run directory), with the
    modification times kept: stages are up to date by them."""
    copy = tmp_path / "copy"
    shutil.copytree(shared_run, copy, symlinks=True)
    return copy


@pytest.mark.slow
def test_run_goes_from_nothing_to_a_results_table(finished_run: Path) -> None:
    run_dir = finished_run / "run"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 4
    assert results["parameters"] > 0
    systems = [s["system"] for s in results["systems"]]
    assert systems == ["averaged (last 2)", "best (dev loss)", "last"]
    refs = (finished_run / "data" / "test.tgt.txt").read_text(encoding="utf-8").splitlines()
    for s in results["systems"]:
        hyp_file = run_dir / f"test.{s['system'].split()[0]}.hyp"
        hyps = hyp_file.read_text(encoding="utf-8").splitlines()
        assert len(hyps) == len(refs)
        assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
        assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
        assert s["bleu_signature"].startswith("nrefs:1")
        assert "compound-split" in s["paper_bleu_signature"]
    averaged = (run_dir / "average.pt").stat()
    assert averaged.st_size > 0
    test_lines = (finished_run / "data" / "test.src.txt").read_text().count("\n")
    assert (run_dir / "test.averaged.hyp").read_text().count("\n") == test_lines
    # The training curves are drawn into the run directory at the end.
    for name in ("curves-steps", "curves-time"):
        assert (run_dir / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (run_dir / f"{name}.svg").stat().st_size > 1000


@pytest.mark.slow
def test_rerun_skips_finished_stages(finished_run: Path) -> None:
    run_dir = finished_run / "run"
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.glob("test.*.hyp")}
    avg_before = (run_dir / "average.pt").stat().st_mtime_ns
    curves = {p.name: p.stat().st_mtime_ns for p in run_dir.glob("curves-*")}
    result = runner.invoke(app, _args(finished_run))
    assert result.exit_code == 0, result.output
    assert "up to date" in result.output
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.glob("test.*.hyp")} == before
    assert (run_dir / "average.pt").stat().st_mtime_ns == avg_before
    # the curves are newer than metrics.jsonl: not drawn again
    assert len(curves) == 4
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.glob("curves-*")} == curves


@pytest.mark.slow
def test_interrupted_run_continues_where_it_stopped(finished_run: Path) -> None:
    run_dir = finished_run / "run"
    (run_dir / "test.best.hyp").unlink()
    (run_dir / "results.json").unlink()
    result = runner.invoke(app, _args(finished_run, "--from", "translate"))
    assert result.exit_code == 0, result.output
    assert (run_dir / "test.best.hyp").is_file()
    assert len(json.loads((run_dir / "results.json").read_text())["systems"]) == 3


@pytest.mark.slow
def test_a_system_that_outputs_mostly_nothing_is_warned_about(finished_run: Path) -> None:
    """An undertrained model's empty lines score near 0 without any error: the table
    alone would hide that, so the run says it (and results.json records it)."""
    run_dir = finished_run / "run"
    hyp = run_dir / "test.last.hyp"
    lines = hyp.read_text().count("\n")
    hyp.write_text("\n" * lines)
    result = runner.invoke(app, _args(finished_run, "--from", "score"))
    assert result.exit_code == 0, result.output
    warning = f"warning: last: {lines:,} of {lines:,} translations are empty"
    assert warning in result.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert any(w.startswith(warning.removeprefix("warning: ")) for w in results["warnings"])


def test_until_stops_early(tmp_path: Path) -> None:
    result = runner.invoke(app, _args(tmp_path, "--until", "prepare"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "manifest.json").is_file()
    assert not (tmp_path / "run").exists()


def test_bad_stage_names_are_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, _args(tmp_path, "--until", "deploy"))
    one_error(result, 2, "unknown stage 'deploy'")
    result = runner.invoke(app, _args(tmp_path, "--from", "score", "--until", "train"))
    one_error(result, 2, "--from score comes after --until train")


def test_interrupted_training_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nmt_cli.engines.run as run_engine
    from nmt_cli.engines.train import TrainResult

    def interrupted(*_: object, **__: object) -> TrainResult:
        return TrainResult(tmp_path, 7, 1.0, None, None, None, None, "signal", 0, signal=15)

    monkeypatch.setattr(run_engine, "train", interrupted)
    result = runner.invoke(app, _args(tmp_path))
    # 128 + SIGTERM, as `nmt train`
    one_error(result, 143, "interrupted by signal 15 at step 7")
    assert not (tmp_path / "run" / "average.pt").exists()
