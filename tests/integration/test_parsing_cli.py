"""Parsing through the CLI: `nmt prepare ptb-sample` on a small test-made treebank zip
(offline and through the verified download), `nmt score --trees`, and `nmt run` of the
sample's recipe from preset to EVALB F1 with a budget of a few steps."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.prepare.treebank import target_form
from nmt_cli.trees.linearize import delinearize
from nmt_cli.trees.scoring import score_trees
from nmt_cli.trees.tree import read_tree

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()
NOUNS = ["dog", "cat", "man", "bank", "firm", "deal", "price", "stock"]
VERBS = ["sees", "buys", "likes", "sells"]


def _tree(i: int) -> str:
    """A small WSJ-style tree, its shape varied by `i` (traces, PRT, punctuation)."""
    a, b, v = NOUNS[i % 8], NOUNS[(i * 3 + 1) % 8], VERBS[i % 4]
    if i % 3 == 0:
        return (
            f"( (S (NP-SBJ-1 (DT The) (NN {a})) (VP (VBZ {v}) (NP (DT a) (NN {b})) "
            f"(PP-LOC (IN in) (NP (NNP York)))) (. .)) )"
        )
    if i % 3 == 1:
        return (
            f"( (S (NP-SBJ (NNS {a}s)) (VP (VBD gave) (PRT (RP up)) (NP (-NONE- *T*-1))) "
            f"(, ,) (NP-SBJ (PRP he)) (VP (VBD said)) (. .)) )"
        )
    return f"( (NP (NP (DT the) (NN {a})) (PP (IN of) (NP (DT the) (NN {b})))) )"


def write_treebank_zip(path: Path) -> Path:
    """Files as NLTK's treebank.zip names them: 3 train, 1 dev, 1 test."""
    files = {1: range(0, 8), 2: range(8, 16), 159: range(16, 24), 160: range(24, 28)}
    files[199] = range(28, 31)
    with zipfile.ZipFile(path, "w") as archive:
        for number, trees in files.items():
            text = "\n".join(_tree(i) for i in trees) + "\n"
            archive.writestr(f"treebank/combined/wsj_{number:04d}.mrg", text)
    return path


@pytest.fixture(scope="module")
def treebank_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_treebank_zip(tmp_path_factory.mktemp("tb") / "treebank.zip")


VOCAB = "60"  # what these few trees support, the 11 tree tokens whole among them


def test_prepare_from_a_zip_keeps_gold_trees_and_encodes_their_linearization(
    treebank_zip: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ptb"
    args = ["prepare", "ptb-sample", "--from", str(treebank_zip), "--out", str(out)]
    done = runner.invoke(app, [*args, "--vocab-size", VOCAB, "-q"])
    assert done.exit_code == 0, done.output
    data = open_data_dir(out)
    assert (data.src_lang, data.tgt_lang) == ("en", "tree")
    source = data.manifest["source"]
    assert (source["kind"], source["name"]) == ("treebank", "ptb-sample")
    assert source["splits"]["valid"] == {"files": 1, "sentences": 4}
    assert data.manifest["settings"]["max_len_ratio"] == 0.0  # the preset's: no ratio filter
    gold = data.raw_text("test", "tgt").read_text().splitlines()
    assert gold[0] == (
        "(TOP (S (NP-SBJ (NNS firms)) (VP (VBD gave) (PRT (RP up)) (NP (-NONE- *T*-1))) "
        "(, ,) (NP-SBJ (PRP he)) (VP (VBD said)) (. .)))"
    )
    words = data.raw_text("test", "src").read_text().splitlines()
    assert words[0] == "firms gave up , he said ."
    # what the model reads and writes: words, and the linearization, one piece a token
    _, tgt = data.split("test")
    pieces = data.vocab.tgt.pieces(list(tgt[0]))
    linearized = target_form(gold[0])
    assert linearized == "(S (NP XX )NP (VP XX (PRT XX )PRT )VP XX (NP XX )NP (VP XX )VP XX )S"
    assert pieces == ["\u2581" + token for token in linearized.split()]
    assert data.vocab.tgt.decode(list(tgt[0])) == linearized


def test_prepare_with_word_leaves_writes_the_words_in_the_trees(
    treebank_zip: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ptbw"
    args = ["prepare", "ptb-sample", "--from", str(treebank_zip), "--out", str(out), "-q"]
    done = runner.invoke(app, [*args, "--vocab-size", VOCAB, "--tree-leaves", "words"])
    assert done.exit_code == 0, done.output
    data = open_data_dir(out)
    assert data.manifest["source"]["tree_leaves"] == "words"
    assert data.manifest["settings"]["tree_leaves"] == "words"
    _, tgt = data.split("test")
    linearized = "(S (NP firms )NP (VP gave (PRT up )PRT )VP , (NP he )NP (VP said )VP . )S"
    assert data.vocab.tgt.decode(list(tgt[0])) == linearized
    pieces = data.vocab.tgt.pieces(list(tgt[0]))
    assert [p for p in pieces if p[1:2] in ("(", ")")] == [
        "\u2581" + t for t in linearized.split() if t[0] in "()"
    ]  # brackets stay whole pieces; words are cut as the vocabulary cuts them
    assert "\u2581XX" not in data.vocab.tgt.pieces(range(len(data.vocab.tgt)))
    # the same directory with the paper's leaves is other data: refused without --force
    again = runner.invoke(app, [*args, "--vocab-size", VOCAB])
    one_error(again, 1, "was prepared with other settings (tree_leaves 'words'")
    one_error(runner.invoke(app, ["prepare", "demo", "--out", str(tmp_path / "d"),
                                  "--tree-leaves", "words"]), 1,
              "--tree-leaves is for treebanks")  # fmt: skip
    one_error(runner.invoke(app, [*args, "--tree-leaves", "tags"]), 2,
              "--tree-leaves must be one of xx, words")  # fmt: skip


def test_prepare_downloads_the_sample_once_and_checks_it(
    treebank_zip: Path, tmp_path: Path
) -> None:
    digest = hashlib.sha256(treebank_zip.read_bytes()).hexdigest()
    env = {
        "NMT_PTB_SAMPLE_URL": treebank_zip.as_uri(),
        "NMT_PTB_SAMPLE_SHA256": digest,
        "NMT_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = tmp_path / "ptb"
    done = runner.invoke(app, ["prepare", "ptb-sample", "--out", str(out), "-q",
                               "--vocab-size", VOCAB], env=env)  # fmt: skip
    assert done.exit_code == 0, done.output
    source = open_data_dir(out).manifest["source"]
    assert source["from"] == "download" and source["sha256"] == digest
    assert (tmp_path / "cache" / "ptb-sample" / "treebank.zip").read_bytes()[:2] == b"PK"
    # a file that is not the official one is refused and not kept
    env = {"NMT_PTB_SAMPLE_URL": treebank_zip.as_uri(), "NMT_CACHE_DIR": str(tmp_path / "c2")}
    line = one_error(runner.invoke(app, ["prepare", "ptb-sample", "--out", str(tmp_path / "x")],
                                   env=env), 1, "is not the expected 9da92d76")  # fmt: skip
    assert "was not kept" in line
    assert not list((tmp_path / "c2").rglob("*.zip"))


def test_the_full_wsj_needs_a_local_copy_and_the_list_shows_both(tmp_path: Path) -> None:
    one_error(
        runner.invoke(app, ["prepare", "ptb", "--out", str(tmp_path / "w")]), 1,
        "licensed Penn Treebank: pass --from DIR",
    )  # fmt: skip
    listed = runner.invoke(app, ["prepare", "--list"])
    assert listed.exit_code == 0
    assert "ptb-sample" in listed.output and "en->tree" in listed.output


def _files(tmp_path: Path, treebank_zip: Path) -> tuple[Path, Path, Path, list[str]]:
    """A gold file, its source words, and linearized outputs: exact, cut short, garbage."""
    from nmt_cli.engines.prepare.treebank import PTB_SAMPLE, read_treebank

    pairs = read_treebank(PTB_SAMPLE, str(treebank_zip), "").pairs["valid"]
    gold, src, hyp = tmp_path / "gold.txt", tmp_path / "src.txt", tmp_path / "hyp.txt"
    gold.write_text("".join(tree + "\n" for _, tree in pairs))
    src.write_text("".join(words + "\n" for words, _ in pairs))
    outputs = [target_form(tree) for _, tree in pairs]
    outputs[1] = " ".join(outputs[1].split()[:4])  # cut short
    outputs[2] = ")S XX XX"
    hyp.write_text("".join(o + "\n" for o in outputs))
    return gold, src, hyp, outputs


def test_score_trees_prints_evalb_figures_and_counts_repairs(
    treebank_zip: Path, tmp_path: Path
) -> None:
    gold, src, hyp, outputs = _files(tmp_path, treebank_zip)
    exact = runner.invoke(app, ["score", "--trees", "--ref", str(gold), str(gold)])
    assert exact.exit_code == 0, exact.output
    assert exact.stdout.startswith("F1 (all) = 100.00  recall 100.00, precision 100.00")
    assert "tagging accuracy 100.00; 4 of 4 sentences" in exact.stdout
    assert "signature: evalb:COLLINS.prm|cutoff:40|hyp:bracketed" in exact.stdout

    args = ["score", "--trees", "--src", str(src), "--ref", str(gold), str(hyp)]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "2 of 4 hypotheses repaired" in text.stderr
    as_json = runner.invoke(app, [*args, "--json"])
    record = json.loads(as_json.stdout)
    expected = score_trees(outputs, gold.read_text().splitlines(), src.read_text().splitlines())
    assert record["all"]["f1"] == pytest.approx(expected.f1) and 0 < expected.f1 < 100
    assert record["repaired"] == 2 and record["all"]["tagging_accuracy"] is None
    assert record["repairs"]["unmatched-close"] == 1 and "trees" not in record


def test_score_trees_refuses_what_it_cannot_score(treebank_zip: Path, tmp_path: Path) -> None:
    gold, src, hyp, _ = _files(tmp_path, treebank_zip)
    short = tmp_path / "short.txt"
    short.write_text(gold.read_text().splitlines()[0] + "\n")
    one_error(runner.invoke(app, ["score", "--trees", "--ref", str(gold), str(short)]), 1,
              "has 1 lines but", "has 4")  # fmt: skip
    broken = tmp_path / "broken.txt"
    broken.write_text("(TOP (S (NP (NN a))\n")
    one_error(runner.invoke(app, ["score", "--trees", "--ref", str(broken), str(broken)]), 1,
              "broken.txt:1: not a well-formed gold tree (unclosed)")  # fmt: skip
    one_error(runner.invoke(app, ["score", "--src", str(src), "--ref", str(gold), str(hyp)]), 2,
              "--src goes with --trees")  # fmt: skip


def _run_args(tmp_path: Path, treebank_zip: Path, *extra: str) -> list[str]:
    settings = [
        f"data.source_dir={treebank_zip}",
        f"data.dir={tmp_path / 'data'}",
        f"train.run_dir={tmp_path / 'run'}",
        f"data.vocab_size={VOCAB}",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.n_heads=2",
        "train.batch_tokens=400",
        "train.max_steps=4",
        "train.save_interval_steps=2",
        "train.max_time_minutes=0",
        "decode.average_last=2",
        "decode.beam_size=2",
        "decode.max_len_b=5",
    ]
    recipe = str(RECIPES / "ptb-sample-parsing.toml")
    return ["run", recipe, *[f"--set={s}" for s in settings], *extra]


@pytest.fixture(scope="module")
def parsing_run(tmp_path_factory: pytest.TempPathFactory, treebank_zip: Path) -> Path:
    tmp_path = tmp_path_factory.mktemp("parse")
    result = runner.invoke(app, _run_args(tmp_path, treebank_zip))
    assert result.exit_code == 0, result.output
    assert "F1 <= 40" in result.stderr  # the parsing table
    return tmp_path


@pytest.mark.slow
def test_run_goes_from_the_preset_to_evalb_f1(parsing_run: Path) -> None:
    run_dir = parsing_run / "run"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 4 and results["systems"] == []
    assert [p["system"] for p in results["parses"]] == ["averaged (last 2)", "best (dev loss)",
                                                        "last"]  # fmt: skip
    data = open_data_dir(parsing_run / "data")
    gold = data.raw_text("test", "tgt").read_text().splitlines()
    words = data.raw_text("test", "src").read_text().splitlines()
    for parse in results["parses"]:
        hyps = (run_dir / f"test.{parse['system'].split()[0]}.hyp").read_text().splitlines()
        expected = score_trees(hyps, gold, words)
        assert parse["f1"] == pytest.approx(expected.f1)
        assert parse["repaired"] == expected.repaired and parse["lines"] == len(gold) == 3
        assert parse["repaired"] == 0  # constrained search writes trees (trees/constraint.py)
        assert parse["signature"] == expected.signature
        trees = Path(parse["trees"]).read_text().splitlines()
        assert trees == expected.trees
        parsed = [read_tree(t)[0] for t in trees]
        assert [p.words() if p else [] for p in parsed] == [w.split() for w in words]
        rescored = runner.invoke(
            app,
            [
                "score",
                "--trees",
                "--json",
                "--ref",
                str(data.raw_text("test", "tgt")),
                parse["trees"],
            ],
        )
        assert json.loads(rescored.stdout)["all"]["f1"] == pytest.approx(parse["f1"])


@pytest.mark.slow
def test_a_parsing_model_translates_into_trees_over_the_words(parsing_run: Path) -> None:
    """`nmt translate` with a parsing model constrains it: an untrained model's every
    output is a well-formed tree with one slot per word (repairs 0), at beam 1 and 3, and
    a prefix or constraints are refused."""
    data = open_data_dir(parsing_run / "data")
    words = data.raw_text("test", "src").read_text().splitlines()
    words += ["a b c d e f g h i j k l", "x"]  # a long sentence; one word
    model = str(parsing_run / "run" / "checkpoints" / "last.pt")
    for beam in ("1", "3"):
        args = ["translate", "-m", model, "--beam", beam, "--max-len-b", "0", "-q"]
        result = runner.invoke(app, args, input="\n".join(words) + "\n")
        assert result.exit_code == 0, result.output
        outputs = result.stdout.splitlines()
        for output, sentence in zip(outputs, words, strict=True):
            read = delinearize(output, sentence.split())
            assert read.repairs == () and read.tree.words() == sentence.split(), output
    refused = runner.invoke(app, ["translate", "-m", model, "--prefix", "(S"], input="a b\n")
    one_error(refused, 2, "this is a parsing model")


@pytest.mark.slow
def test_run_refuses_to_score_trees_as_text(parsing_run: Path, treebank_zip: Path) -> None:
    args = _run_args(parsing_run, treebank_zip, "--from", "score", "--set=score.metric=bleu")
    one_error(runner.invoke(app, args), 1, "holds parse trees", 'score.metric = "trees"')


@pytest.mark.slow
def test_sweep_of_the_parsing_recipe_reports_dev_and_test_f1(
    treebank_zip: Path, tmp_path: Path
) -> None:
    """Section 6.3 chose beam and alpha on the dev trees: a parsing sweep's table scores
    them by EVALB F1, not BLEU."""
    settings = [s for s in _run_args(tmp_path, treebank_zip)[2:] if "run_dir" not in s]
    grid = tmp_path / "parse-grid.toml"
    grid.write_text(
        f"""
[sweep]
recipe = {json.dumps(str(RECIPES / "ptb-sample-parsing.toml"))}
runs_dir = {json.dumps(str(tmp_path / "runs"))}
set = {json.dumps([s.removeprefix("--set=") for s in settings])}
[[sweep.rows]]
name = "beam 2"
[[sweep.rows]]
name = "beam 1"
set = ["decode.beam_size=1", "decode.length_penalty=0.0"]
""",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["sweep", str(grid), "--jobs", "1"], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    for column in ("beam", "alpha", "dev F1", "test F1"):
        assert column in result.output
    assert "BLEU" not in result.output
    table = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    rows = {r["name"]: r for r in table["rows"]}
    data = open_data_dir(tmp_path / "data")
    gold = data.raw_text("valid", "tgt").read_text().splitlines()
    words = data.raw_text("valid", "src").read_text().splitlines()
    assert (rows["beam 2"]["beam"], rows["beam 1"]["beam"]) == (2, 1)
    for name, row in rows.items():
        run_dir = tmp_path / "runs" / name.replace(" ", "_")
        hyps = (run_dir / "dev.last.hyp").read_text().splitlines()
        assert row["metric"] == "trees" and row["dev_bleu"] is None
        assert row["dev_f1"] == pytest.approx(score_trees(hyps, gold, words).all.f1)
        parses = json.loads((run_dir / "results.json").read_text())["parses"]
        last = next(p for p in parses if p["system"] == "last")
        assert row["test_f1"] == pytest.approx(last["f1"])
