"""`nmt score`: sacreBLEU/chrF/TER with signatures, the paper's tokenized BLEU, JSON,
confidence intervals, paired tests and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from typer.testing import CliRunner
from unix_helpers import error_line, no_escape

from nmt_cli.cli import app
from nmt_cli.engines.score import ScoreSettings, paper_tokenize, score_lines

runner = CliRunner()

REFS = [
    "Ein Mann fährt ein rotes Fahrrad.",
    "Zwei Hunde spielen im Schnee-Feld.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf der Straße.",
]
HYPS = [
    "Ein Mann fährt ein rotes Rad.",
    "Zwei Hunde spielen im Schnee-Feld.",
    "Eine Frau liest im Park ein Buch.",
    "Kinder spielen auf der Straße.",
]
WORSE = ["Ein Mann.", "Hunde.", "Eine Frau liest.", "Kinder."]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, lines in (("ref", REFS), ("hyp", HYPS), ("worse", WORSE)):
        out[name] = tmp_path / f"{name}.txt"
        out[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["score", *args], input=stdin)
    no_escape(result)
    return result.exit_code, result.stdout, result.stderr


def test_sacrebleu_scores_and_signatures(files: dict[str, Path]) -> None:
    code, out, err = invoke("--ref", str(files["ref"]), str(files["hyp"]))
    assert code == 0, err
    bleu = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert f"BLEU = {bleu.score:.2f}" in out
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out
    assert f"chrF2 = {sacrebleu.corpus_chrf(HYPS, [REFS]).score:.2f}" in out
    assert f"TER = {sacrebleu.corpus_ter(HYPS, [REFS]).score:.2f}" in out
    assert "tokenized BLEU =" in out and "NOT comparable with sacreBLEU" in out


def test_paper_tokenization_splits_hyphenated_compounds() -> None:
    assert paper_tokenize(["Ein Haus-Boot, bitte."], "de") == [
        "Ein Haus ##AT##-##AT## Boot , bitte ."
    ]
    # Compound splitting is the paper's EN-DE procedure only.
    assert paper_tokenize(["Un arc-en-ciel."], "fr") == ["Un arc-en-ciel ."]
    result = score_lines(HYPS, [REFS], ScoreSettings(paper=True, lang="fr"))
    assert result.paper_bleu is not None
    assert result.paper_bleu.signature.startswith("tok:moses-fr|")


def test_paper_bleu_is_bleu_on_tokenized_compound_split_text() -> None:
    result = score_lines(HYPS, [REFS], ScoreSettings(paper=True))
    tok = sacrebleu.corpus_bleu(
        paper_tokenize(HYPS, "de"), [paper_tokenize(REFS, "de")], tokenize="none", force=True
    )
    assert result.paper_bleu is not None
    assert result.paper_bleu.score == pytest.approx(tok.score)
    assert result.paper_bleu.signature.startswith("tok:moses-de+compound-split|")
    assert "tok:none" in result.paper_bleu.signature
    assert score_lines(HYPS, [REFS], ScoreSettings(paper=False)).paper_bleu is None


def test_stdin_multiple_references_and_json(files: dict[str, Path]) -> None:
    code, out, err = invoke(
        "--ref", str(files["ref"]), "--ref", str(files["hyp"]), "--json", stdin="\n".join(HYPS)
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["lines"] == 4 and data["references"] == 2
    names = [m["name"] for m in data["metrics"]]
    assert names == ["BLEU", "chrF2", "TER", "tokenized BLEU"]
    assert data["metrics"][0]["score"] == pytest.approx(100.0)  # hyps are one of the refs
    assert data["metrics"][0]["signature"].startswith("nrefs:2|")


def test_bootstrap_confidence_intervals(files: dict[str, Path]) -> None:
    code, out, _ = invoke("--ref", str(files["ref"]), str(files["hyp"]), "--bootstrap", "50")
    assert code == 0
    assert "95% CI ±" in out and "bs:50" in out


def test_bootstrap_of_a_text_with_resamples_that_count_nothing() -> None:
    """A resample of only the first line has no character n-gram or word right: chrF
    and TER score it 0 beside the others' float32 scores (sacreBLEU's mix, which its
    mean refused), and the interval is still reported."""
    result = score_lines(["y", "a b"], [["x", "a c"]], ScoreSettings(bootstrap=20, paper=False))
    for metric in result.metrics:
        assert metric.mean is not None and metric.ci is not None and metric.ci >= 0
        assert type(metric.mean) is float


def test_paired_significance_between_two_systems(files: dict[str, Path]) -> None:
    result = score_lines(HYPS, [REFS], ScoreSettings(paper=False), other=WORSE)
    bleu = next(c for c in result.comparisons if c.metric == "BLEU")
    assert bleu.baseline == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert bleu.other == pytest.approx(sacrebleu.corpus_bleu(WORSE, [REFS]).score)
    assert bleu.baseline > bleu.other
    assert 0.0 < bleu.p_value <= 1.0
    code, out, _ = invoke(
        "--ref", str(files["ref"]), str(files["hyp"]), "--compare", str(files["worse"])
    )
    assert code == 0 and "p = " in out and "paired bootstrap" in out


def test_mismatched_line_counts_name_both(files: dict[str, Path], tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("one line\n", encoding="utf-8")
    code, _, err = invoke("--ref", str(files["ref"]), str(short))
    assert code == 1
    line = error_line(err)
    assert "has 1 lines but" in line and "has 4" in line


def test_empty_reference_and_missing_files(files: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    code, _, err = invoke("--ref", str(empty), str(files["hyp"]))
    assert code == 1 and "the reference is empty" in error_line(err)
    code, _, err = invoke("--ref", str(tmp_path / "nope.txt"), str(files["hyp"]))
    assert code == 1 and "no such file" in error_line(err)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nbroken \xff here\n")
    code, _, err = invoke("--ref", str(files["ref"]), str(bad))
    assert code == 1 and "bad.txt:2: not valid UTF-8 (byte 0xff at column 8)" in error_line(err)
