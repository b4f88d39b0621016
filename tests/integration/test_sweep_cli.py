"""`nmt sweep`: a two-row grid on a tiny slice of the demo corpus, its table and rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.engines.sweep import load_sweep

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()


def _sweep_file(tmp_path: Path) -> Path:
    settings = [
        f"data.dir={json.dumps(str(tmp_path / 'data'))}",
        "data.max_pairs=300",
        "data.vocab_size=120",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.n_heads=2",
        "train.batch_tokens=500",
        "train.max_steps=3",
        "train.save_interval_steps=2",
        "train.max_time_minutes=0",
        "train.precision='fp32'",
        "decode.average_last=2",
        "decode.max_len_b=4",
    ]
    path = tmp_path / "grid.toml"
    path.write_text(
        f"""
[sweep]
recipe = {json.dumps(str(RECIPES / "demo.toml"))}
runs_dir = {json.dumps(str(tmp_path / "runs"))}
set = {json.dumps(settings)}
[[sweep.rows]]
name = "base"
[[sweep.rows]]
name = "B d_k=8"
set = ["model.d_k=8"]
""",
        encoding="utf-8",
    )
    return path


def _bleu(hyp_file: Path, ref_file: Path) -> float:
    """sacreBLEU of a file of translations, computed here, apart from nmt's scoring."""
    hyps = hyp_file.read_text(encoding="utf-8").splitlines()
    refs = ref_file.read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs) > 0
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


@pytest.mark.slow
def test_sweep_runs_every_row_prints_table_3_and_skips_finished_rows(tmp_path: Path) -> None:
    grid = _sweep_file(tmp_path)
    first = runner.invoke(app, ["sweep", str(grid), "--jobs", "2"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    for column in ("d_model", "d_k", "P_drop", "eps_ls", "dev PPL", "dev BLEU", "FLOPs"):
        assert column in first.output
    table = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    rows = {r["name"]: r for r in table["rows"]}
    assert set(rows) == {"base", "B d_k=8"}
    assert rows["base"]["d_k"] == 16 and rows["B d_k=8"]["d_k"] == 8
    assert rows["B d_k=8"]["d_v"] == 16  # row B changes d_k alone
    for name, row in rows.items():
        run_dir, data = tmp_path / "runs" / name.replace(" ", "_"), tmp_path / "data"
        assert row["status"] == "done" and row["steps"] == 3 and row["dev_ppl"] > 1
        dev_bleu = _bleu(run_dir / "dev.last.hyp", data / "valid.tgt.txt")
        assert row["dev_bleu"] == pytest.approx(dev_bleu)
        test_bleu = _bleu(run_dir / "test.last.hyp", data / "test.tgt.txt")
        assert row["test_bleu"] == pytest.approx(test_bleu)
        assert row["train_flops"] > 0 and row["device_flops"] > 0
    assert rows["B d_k=8"]["parameters"] < rows["base"]["parameters"]
    assert (tmp_path / "runs" / "B_d_k=8" / "results.json").is_file()

    again = runner.invoke(app, ["sweep", str(grid)])
    assert again.exit_code == 0, again.output
    assert again.output.count("skipped (complete)") == 2

    # the table of what is done so far, running nothing: one row made incomplete
    (tmp_path / "runs" / "B_d_k=8" / "dev.last.hyp").unlink()
    table = runner.invoke(app, ["sweep", str(grid), "--table"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "base" in table.output and "B d_k=8" in table.output
    assert not (tmp_path / "runs" / "B_d_k=8" / "dev.last.hyp").exists()
    base_line = next(line for line in table.output.splitlines() if "│ base" in line)
    d_k_line = next(line for line in table.output.splitlines() if "│ B d_k=8" in line)
    assert "e+" in base_line  # FLOPs of a finished row
    assert d_k_line.rstrip("│ ").endswith("-")  # pending: no FLOPs yet


@pytest.mark.parametrize("sweep", sorted((RECIPES / "sweeps").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_sweeps_load_every_row(sweep: Path) -> None:
    plan = load_sweep(sweep)
    assert plan.rows[0].name == "base" and len(plan.rows) == 21
    (restricted,) = [row for row in plan.rows if row.name.startswith("R window=")]
    assert plan.row_recipe(restricted).model.attention_window > 0
    big = plan.row_recipe(plan.rows[-1])
    assert (
        big.model.dropout == 0.3
        and big.model.d_model == 2 * plan.row_recipe(plan.rows[0]).model.d_model
    )


def test_bad_sweep_files_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nrecipe = "nowhere.toml"\nruns_dir = "r"\n[[sweep.rows]]\nname = "x"\n')
    result = runner.invoke(app, ["sweep", str(bad)])
    one_error(result, 1, "nowhere.toml")
    typo = tmp_path / "typo.toml"
    typo.write_text(
        f'[sweep]\nrecipe = {json.dumps(str(RECIPES / "demo.toml"))}\nruns_dir = "r"\n'
        '[[sweep.rows]]\nname = "x"\nset = ["model.d_modle=3"]\n'
    )
    result = runner.invoke(app, ["sweep", str(typo)])
    one_error(result, 1, "row 'x'", "d_model")
