"""`nmt plot`: training curves from metrics.jsonl, several runs overlaid, and the notice
`nmt run` gives instead of curves when matplotlib is missing."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.engines.run import _plot
from nmt_cli.engines.training_log import read_run_log

runner = CliRunner()


def fake_run(root: Path, speed: float, grad_norm: bool = True) -> Path:
    """A run directory whose metrics.jsonl looks like `nmt train`'s, with a partial last
    line as a live run may have."""
    root.mkdir(parents=True)
    lines = []
    for step in range(10, 201, 10):
        decay = 1 + step / 50
        record = {
            "type": "train",
            "step": step,
            "epoch": 1,
            "loss": 9.0 * speed / decay,
            "nll": 8.0 / decay,
            "lr": 1e-3 * min(1.0, step / 100),
            "elapsed_s": step * 3.0,
            "tokens_per_s": 1000.0 * speed,
        }
        if grad_norm:
            record["grad_norm"] = 2.0 / decay
        lines.append(json.dumps(record))
        if step % 50 == 0:
            valid = {
                "type": "valid",
                "step": step,
                "dev_loss": 7.0 / decay,
                "dev_ppl": 1000.0 / step,
                "dev_bleu": step / 10.0,
                "elapsed_s": step * 3.1,
            }
            lines.append(json.dumps(valid))
    (root / "metrics.jsonl").write_text("\n".join(lines) + '\n{"type": "tra')
    return root


def test_reading_metrics_skips_a_partial_line(tmp_path: Path) -> None:
    log = read_run_log(fake_run(tmp_path / "base", 1.0))
    assert log.name == "base"
    lr = log.series("train", "lr")
    assert (
        lr.steps[:2] == [10, 20] and lr.values[-1] == pytest.approx(1e-3) and len(lr.values) == 20
    )
    bleu = log.series("valid", "dev_bleu")
    assert bleu.steps == [50, 100, 150, 200] and bleu.seconds[0] == pytest.approx(155.0)
    assert not log.series("valid", "nothing")


@pytest.mark.slow
def test_plot_overlays_runs_in_decodable_pictures(tmp_path: Path) -> None:
    import matplotlib.image

    a = fake_run(tmp_path / "base", 1.0)
    b = fake_run(tmp_path / "big", 0.5, grad_norm=False)
    result = runner.invoke(app, ["plot", str(a), str(b), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    names = sorted(Path(p).name for p in result.stdout.split())
    assert names == ["curves-steps.png", "curves-steps.svg", "curves-time.png", "curves-time.svg"]
    pictures = {}
    for name in names:
        path = tmp_path / "out" / name
        assert path.stat().st_size > 10_000
        if name.endswith(".png"):
            pictures[name] = np.asarray(matplotlib.image.imread(path))
            assert pictures[name].shape[0] > 500 and pictures[name].shape[1] > 1000
        else:
            svg = path.read_text(encoding="utf-8")
            assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"
            for text in ("base train", "big dev", "gradient norm", "dev BLEU", "tokens / s"):
                assert text in svg
    assert "training time (minutes)" in (tmp_path / "out/curves-time.svg").read_text()
    assert pictures["curves-steps.png"].shape == pictures["curves-time.png"].shape
    assert np.abs(pictures["curves-steps.png"] - pictures["curves-time.png"]).max() > 0.1
    # One run: into its own directory by default; a missing figure says "not logged".
    result = runner.invoke(app, ["plot", str(b), "--format", "svg"])
    assert result.exit_code == 0, result.stderr
    assert (
        "not logged" in (b / "curves-steps.svg").read_text()
        and not (b / "curves-steps.png").exists()
    )


def test_plot_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = fake_run(tmp_path / "run", 1.0)
    for args, message in [
        ([str(tmp_path / "missing")], "missing: no run directory"),
        ([str(empty)], "empty: no metrics.jsonl in it"),
        ([str(run), "-o", str(blocker / "out")], "cannot create the directory"),
        ([str(run), "--format", "pdf"], "--format pdf: use png, svg or both"),
    ]:
        result = runner.invoke(app, ["plot", *args])
        one_error(result, 1, message)
        assert len(result.stderr.strip().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    result = runner.invoke(app, ["plot", str(run)])
    line = one_error(result, 1)
    assert line.endswith("needs it: pip install 'nmt-cli[plot]' (or pip install matplotlib)")
    assert not (run / "curves-steps.png").exists()


def test_run_notices_missing_matplotlib_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = fake_run(tmp_path / "run", 1.0)  # (with matplotlib: test_run_cli's curves)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert _plot(run) == (
        "no training curves: matplotlib is not installed, and drawing PNG/SVG pictures "
        "needs it: pip install 'nmt-cli[plot]' (or pip install matplotlib)"
    )
    assert _plot(tmp_path) == "no metrics.jsonl, no training curves"
