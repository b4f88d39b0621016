"""`nmt prepare` end to end on tiny corpora the tests write: every source kind, resume,
the cleaning counts, and every bad input the issue lists."""

from __future__ import annotations

import dataclasses
import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.config import DataConfig
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.prepare import (
    PrepareConfig,
    StageEvent,
    prepare,
    prepare_from_data_config,
    presets,
)
from nmt_cli.engines.prepare.demo_corpus import generate_pair
from nmt_cli.errors import NmtError

runner = CliRunner()
VOCAB = "150"


def pairs(n: int, offset: int = 0) -> list[tuple[str, str]]:
    return [generate_pair(3, offset + i) for i in range(n)]


def write_side(path: Path, lines: list[str], gz: bool = True) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def text_corpus(root: Path, tests: tuple[str, ...] = ("test_2016_flickr",)) -> Path:
    """A Multi30k-shaped directory: train, val and suffixed test files, gzipped."""
    root.mkdir(parents=True, exist_ok=True)
    splits = {"train": pairs(400), "val": pairs(30, 1000)}
    for i, name in enumerate(tests):
        splits[name] = pairs(20, 2000 + 100 * i)
    for name, items in splits.items():
        write_side(root / f"{name}.en.gz", [a for a, _ in items])
        write_side(root / f"{name}.de.gz", [b for _, b in items])
    return root


def cli(*args: str) -> Result:
    return runner.invoke(app, ["prepare", *args], env={"COLUMNS": "200"})


def error_line(result: Result, code: int = 1) -> str:
    return one_error(result, code)


@pytest.fixture(scope="module")
def m30k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return text_corpus(tmp_path_factory.mktemp("corpus") / "m30k")


@pytest.fixture(scope="module")
def prepared(m30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "m30k-en-de"
    result = cli(
        "--from", str(m30k), "--src", "en", "--tgt", "de", "--out", str(out), "--vocab-size", VOCAB
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    return out


# --- the text directory, end to end -------------------------------------------------------


def test_text_directory_gives_a_complete_readable_data_directory(
    prepared: Path, m30k: Path
) -> None:
    data = open_data_dir(prepared)
    assert data.splits == ["train", "valid", "test"]
    assert (data.src_lang, data.tgt_lang) == ("en", "de")
    assert data.vocab.joint and len(data.vocab.src) == int(VOCAB)
    train_src_text = gzip.decompress((m30k / "train.en.gz").read_bytes()).decode().splitlines()
    src, tgt = data.split("train")
    assert len(src) == len(tgt) == data.manifest["splits"]["train"]["pairs"]
    kept = data.manifest["cleaning"]["train"]["kept"]
    assert kept == len(src) and data.manifest["cleaning"]["train"]["read"] == 400
    first_kept = open_data_dir(prepared).vocab.src.decode(src[0].tolist())
    assert first_kept in train_src_text
    assert int(src.tokens.max()) < int(VOCAB) and src.dtype.__name__ == "uint8"
    assert data.manifest["splits"]["train"]["src_tokens"] == int(src.lengths.sum())
    # held-out text is kept whole and raw, for BLEU against the real references
    val_de = gzip.decompress((m30k / "val.de.gz").read_bytes()).decode().splitlines()
    assert data.raw_text("valid", "tgt").read_text(encoding="utf-8").splitlines() == val_de
    assert data.manifest["splits"]["test"]["pairs"] == 20
    assert data.changed_files() == []
    assert not (prepared / ".prepare").exists()
    manifest = data.manifest
    assert manifest["source"]["files"]["test"] == [
        "test_2016_flickr.en.gz",
        "test_2016_flickr.de.gz",
    ]
    assert set(manifest["versions"]) >= {"nmt", "sentencepiece", "datasets", "numpy"}
    vocab = manifest["vocab"]
    assert (vocab["size"], vocab["joint"], vocab["type"]) == (int(VOCAB), True, "sentencepiece-bpe")
    assert vocab["sample_pairs"] == kept  # a small corpus: every kept pair, under the bound
    assert vocab["src_model"] == vocab["tgt_model"] == "spm.model"


def test_rerun_skips_every_stage_and_leaves_the_manifest_alone(prepared: Path, m30k: Path) -> None:
    before = (prepared / "manifest.json").read_bytes()
    result = cli(
        "--from",
        str(m30k),
        "--src",
        "en",
        "--tgt",
        "de",
        "--out",
        str(prepared),
        "--vocab-size",
        VOCAB,
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("(done before)") == 4 and "up to date" in result.output
    assert (prepared / "manifest.json").read_bytes() == before


def test_a_different_setting_is_refused_by_name_and_force_redoes(
    prepared: Path, m30k: Path, tmp_path: Path
) -> None:
    out = tmp_path / "copy"
    base = ["--from", str(m30k), "--src", "en", "--tgt", "de", "--out", str(out)]
    assert cli(*base, "--vocab-size", VOCAB).exit_code == 0
    line = error_line(cli(*base, "--vocab-size", "120", "--dedup"))
    assert "dedup False -> True" in line and "vocab_size 150 -> 120" in line and "--force" in line
    result = cli(*base, "--vocab-size", "120", "--dedup", "--force")
    assert result.exit_code == 0, result.output
    manifest = open_data_dir(out).manifest
    assert manifest["vocab"]["size"] == 120 and manifest["settings"]["dedup"] is True


def test_naming_the_test_split_that_was_chosen_anyway_is_not_a_change(
    prepared: Path, m30k: Path
) -> None:
    base = ["--from", str(m30k), "--src", "en", "--tgt", "de", "--out", str(prepared)]
    base += ["--vocab-size", VOCAB]
    assert cli(*base, "--test-split", "test_2016_flickr").exit_code == 0
    line = error_line(cli(*base, "--test-split", "test_2017"))
    assert "prepared with the test set 'test_2016_flickr', not 'test_2017'" in line


def test_a_changed_file_is_noticed_on_rerun(m30k: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    base = [
        "--from",
        str(m30k),
        "--src",
        "en",
        "--tgt",
        "de",
        "--out",
        str(out),
        "--vocab-size",
        VOCAB,
    ]
    assert cli(*base).exit_code == 0
    (out / "valid.tgt.txt").write_text("tampered\n", encoding="utf-8")
    assert "valid.tgt.txt changed" in error_line(cli(*base))
    assert cli(*base, "--force").exit_code == 0


# --- interruption at any stage resumes to the same manifest -------------------------------


class Interrupt:
    """A progress callback that stops the run at the first event of one stage."""

    def __init__(self, stage: str, kind: str, skip: int = 0) -> None:
        self.stage, self.kind, self.skip = stage, kind, skip
        self.events: list[StageEvent] = []

    def __call__(self, event: StageEvent) -> None:
        self.events.append(event)
        if event.stage == self.stage and event.kind == self.kind:
            if self.skip == 0:
                raise KeyboardInterrupt
            self.skip -= 1


@pytest.mark.parametrize(
    ("stage", "kind", "skip"),
    [("clean", "start", 1), ("vocab", "start", 0), ("binarize", "end", 1), ("manifest", "end", 0)],
)
def test_interrupted_run_resumes_to_an_identical_manifest(
    prepared: Path, m30k: Path, tmp_path: Path, stage: str, kind: str, skip: int
) -> None:
    cfg = PrepareConfig(
        out=str(tmp_path / "out"), source=str(m30k), src="en", tgt="de", vocab_size=int(VOCAB)
    )
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, Interrupt(stage, kind, skip))
    assert not (tmp_path / "out" / "manifest.json").exists() or stage == "manifest"
    (tmp_path / "out" / ".train.src.bin.killed.tmp").write_bytes(b"half a write")
    result = prepare(cfg)
    assert (tmp_path / "out" / "manifest.json").read_bytes() == (
        prepared / "manifest.json"
    ).read_bytes()
    ran = {r.stage: r.ran for r in result.stages}
    order = ["clean", "vocab", "binarize", "manifest"]
    assert all(not ran[s] for s in order[: order.index(stage)]), ran
    assert not list((tmp_path / "out").glob(".*.tmp"))


@pytest.mark.slow
def test_kill_minus_9_during_parallel_encoding_then_rerun(tmp_path: Path) -> None:
    """A real SIGKILL while the worker pool encodes: the rerun resumes to the same manifest."""
    root = tmp_path / "big"
    root.mkdir()
    items = pairs(60_000)
    for name, part in (("train", items), ("dev", items[:50])):
        write_side(root / f"{name}.en", [a for a, _ in part], gz=False)
        write_side(root / f"{name}.de", [b for _, b in part], gz=False)
    command = [sys.executable, "-m", "nmt_cli", "prepare", "--from", str(root), "--src", "en"]
    command += ["--tgt", "de", "--vocab-size", "300", "--workers", "2", "--out"]
    reference = subprocess.run([*command, str(tmp_path / "ref")], capture_output=True, check=False)
    assert reference.returncode == 0, reference.stderr.decode()
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [*command, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    state = out / ".prepare" / "state.json"
    while proc.poll() is None and '"vocab"' not in (state.read_text() if state.is_file() else ""):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10  # orphaned workers notice their parent is gone
    while _processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(out)) == []
    rerun = subprocess.run([*command, str(out)], capture_output=True, check=False)
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert (out / "manifest.json").read_bytes() == (tmp_path / "ref" / "manifest.json").read_bytes()
    assert not list(out.glob(".*.tmp"))


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# --- the other sources -------------------------------------------------------------------


def write_datasets_files(root: Path, fmt: str) -> Path:
    import datasets

    root.mkdir(parents=True)
    for split, items in (
        ("train", pairs(300)),
        ("validation", pairs(20, 900)),
        ("test", pairs(10, 950)),
    ):
        rows = [{"translation": {"en": a, "de": b}} for a, b in items]
        ds = datasets.Dataset.from_list(rows)
        if fmt == "parquet":
            ds.to_parquet(str(root / f"{split}.parquet"))
        else:
            ds.to_json(str(root / f"{split}.jsonl"))
    return root


@pytest.mark.parametrize("fmt", ["parquet", "json", "save_to_disk"])
def test_local_datasets_data_in_the_wmt14_schema(tmp_path: Path, fmt: str) -> None:
    import datasets

    if fmt == "save_to_disk":
        splits = {
            "train": [{"translation": {"en": a, "de": b}} for a, b in pairs(300)],
            "validation": [{"translation": {"en": a, "de": b}} for a, b in pairs(20, 900)],
        }
        source = tmp_path / "saved"
        datasets.DatasetDict(
            {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        ).save_to_disk(str(source))
    else:
        source = write_datasets_files(tmp_path / fmt, fmt)
    out = tmp_path / "out"
    result = cli(
        "--from",
        str(source),
        "--src",
        "de",
        "--tgt",
        "en",
        "--out",
        str(out),
        "--vocab-size",
        "120",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert result.exit_code == 0, result.output
    data = open_data_dir(out)
    assert data.manifest["source"]["kind"] == "datasets"
    assert data.manifest["cleaning"]["train"]["read"] == 300
    assert (
        data.raw_text("valid", "src").read_text(encoding="utf-8").splitlines()[0]
        == pairs(1, 900)[0][1]
    )
    assert data.splits == (
        ["train", "valid"] if fmt == "save_to_disk" else ["train", "valid", "test"]
    )


def test_wrong_schema_is_a_clear_error(tmp_path: Path) -> None:
    import datasets

    root = tmp_path / "bad"
    root.mkdir()
    for split in ("train", "validation"):
        datasets.Dataset.from_list([{"text": "x"}]).to_parquet(str(root / f"{split}.parquet"))
    line = error_line(
        cli(
            "--from",
            str(root),
            "--src",
            "en",
            "--tgt",
            "de",
            "--out",
            str(tmp_path / "o"),
            "--cache-dir",
            str(tmp_path / "c"),
        )
    )
    assert "expected the WMT14 schema" in line and "found columns text" in line


def test_presets_go_through_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wmt14 preset code path, pointed at a local Hub-shaped folder instead of the Hub."""
    local = write_datasets_files(tmp_path / "hub", "parquet")
    preset = dataclasses.replace(presets.PRESETS["wmt14-de-en"], hf_path=str(local), hf_name="")
    monkeypatch.setitem(presets.PRESETS, "wmt14-de-en", preset)
    out = tmp_path / "out"
    result = cli(
        "wmt14-de-en",
        "--out",
        str(out),
        "--vocab-size",
        "120",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert result.exit_code == 0, result.output
    data = open_data_dir(out)
    assert (data.src_lang, data.tgt_lang) == ("de", "en")
    assert data.manifest["source"] == {
        "kind": "preset",
        "name": "wmt14-de-en",
        "dataset": str(local),
        "config": "",
    }
    assert (
        data.raw_text("test", "tgt").read_text(encoding="utf-8").splitlines()[0]
        == pairs(1, 950)[0][0]
    )


def test_preset_list_and_unknown_preset() -> None:
    result = cli("--list")
    assert result.exit_code == 0
    for name in (
        "demo",
        "wmt14-en-de",
        "wmt14-de-en",
        "wmt14-en-fr",
        "wmt14-fr-en",
        "37,000",
        "32,000",
    ):
        assert name in result.output
    line = error_line(cli("wmt15-en-de", "--out", "unused"))
    assert "unknown corpus 'wmt15-en-de'" in line and "wmt14-en-fr" in line and "demo" in line
    assert not Path("unused").exists()


def test_explicit_paths_and_separate_vocabularies(m30k: Path, tmp_path: Path) -> None:
    for name, items in (("tr", pairs(300)), ("dv", pairs(20, 500))):
        write_side(tmp_path / f"{name}.en", [a for a, _ in items], gz=False)
        write_side(tmp_path / f"{name}.de", [b for _, b in items], gz=False)
    out = tmp_path / "out"
    result = cli(
        "--train-src",
        str(tmp_path / "tr.en"),
        "--train-tgt",
        str(tmp_path / "tr.de"),
        "--valid-src",
        str(tmp_path / "dv.en"),
        "--valid-tgt",
        str(tmp_path / "dv.de"),
        "--src",
        "en",
        "--tgt",
        "de",
        "--out",
        str(out),
        "--vocab-size",
        "100",
        "--separate-vocab",
    )
    assert result.exit_code == 0, result.output
    data = open_data_dir(out)
    assert not data.vocab.joint
    assert data.manifest["vocab"]["src_model"] == "spm.src.model"
    assert data.vocab.src.encode(["der Hund"]) != data.vocab.tgt.encode(["der Hund"])


def test_demo(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = cli("demo", "--out", str(out), "--max-pairs", "3000", "--vocab-size", "400")
    assert result.exit_code == 0, result.output
    data = open_data_dir(out)
    assert data.manifest["splits"]["train"]["pairs"] == 3000
    assert data.manifest["splits"]["valid"]["pairs"] == 500
    assert data.manifest["source"]["kind"] == "demo"
    src, _ = data.split("test")
    assert (
        data.vocab.src.decode(src[0].tolist())
        == data.raw_text("test", "src").read_text(encoding="utf-8").splitlines()[0]
    )


# --- cleaning and sampling, as recorded in the manifest -----------------------------------


def test_each_cleaning_rule_is_counted(tmp_path: Path) -> None:
    good = pairs(300)
    extra = [
        ("", "leer"),
        ("   ", "  "),
        (
            "one two three four five six seven eight nine ten eleven twelve thirteen",
            "eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn",
        ),
        ("a b c d", "a"),
        good[0],
        good[1],
    ]
    root = tmp_path / "c"
    root.mkdir()
    items = good + extra
    write_side(root / "train.en", [a for a, _ in items], gz=False)
    write_side(root / "train.de", [b for _, b in items], gz=False)
    write_side(root / "dev.en", ["Hallo „Welt“"], gz=False)
    write_side(
        root / "dev.de",
        [
            "",
        ],
        gz=False,
    )
    out = tmp_path / "out"
    result = cli(
        "--from",
        str(root),
        "--src",
        "en",
        "--tgt",
        "de",
        "--out",
        str(out),
        "--vocab-size",
        "100",
        "--max-len",
        "12",
        "--dedup",
        "--normalize-punctuation",
    )
    assert result.exit_code == 0, result.output
    manifest = open_data_dir(out).manifest
    train = manifest["cleaning"]["train"]
    long_good = sum(1 for a, b in good if max(len(a.split()), len(b.split())) > 12)
    ratio_good = sum(
        1
        for a, b in good
        if len(a.split()) <= 12
        and len(b.split()) <= 12
        and max(len(a.split()), len(b.split())) > 1.5 * min(len(a.split()), len(b.split()))
    )
    assert train["dropped"] == {
        "empty": 2,
        "too_long": 1 + long_good,
        "ratio": 1 + ratio_good,
        "duplicate": 2,
    }
    assert train["kept"] == 300 - long_good - ratio_good
    assert "dropped: empty 2" in result.output
    # held-out sets are never filtered, even an empty target line
    assert manifest["splits"]["valid"]["pairs"] == 1
    assert (out / "valid.src.txt").read_text(encoding="utf-8") == "Hallo „Welt“\n"


def test_max_pairs_takes_a_prefix_or_a_seeded_sample(m30k: Path, tmp_path: Path) -> None:
    def train_text(*extra: str) -> list[str]:
        out = tmp_path / "_".join(extra).replace("-", "")
        result = cli(
            "--from",
            str(m30k),
            "--src",
            "en",
            "--tgt",
            "de",
            "--out",
            str(out),
            "--vocab-size",
            "100",
            "--max-len-ratio",
            "0",
            *extra,
        )
        assert result.exit_code == 0, result.output
        data = open_data_dir(out)
        src, _ = data.split("train")
        return [data.vocab.src.decode(src[i].tolist()) for i in range(len(src))]

    original = gzip.decompress((m30k / "train.en.gz").read_bytes()).decode().splitlines()
    assert train_text("--max-pairs", "50") == original[:50]
    sample = train_text("--max-pairs", "50", "--sample")
    assert len(sample) == 50 and sample != original[:50]
    assert [original.index(s) for s in sample] == sorted(original.index(s) for s in sample)
    assert train_text("--max-pairs", "50", "--sample", "--seed", "1", "--workers", "1") == sample


# --- bad input -----------------------------------------------------------------------------


def test_line_count_mismatch_names_both_files_and_counts(tmp_path: Path) -> None:
    root = text_corpus(tmp_path / "c")
    write_side(root / "val.de.gz", [b for _, b in pairs(29, 1000)])
    out = tmp_path / "out"
    line = error_line(cli("--from", str(root), "--src", "en", "--tgt", "de", "--out", str(out)))
    assert f"{root / 'val.en.gz'} has 30 lines but {root / 'val.de.gz'} has 29" in line
    assert not out.exists()


def test_bad_utf8_stops_with_file_and_line_or_is_replaced(tmp_path: Path) -> None:
    root = text_corpus(tmp_path / "c")
    lines = gzip.decompress((root / "train.de.gz").read_bytes()).split(b"\n")
    lines[6] = b"kaputt \xc3\x28 hier"
    (root / "train.de.gz").write_bytes(gzip.compress(b"\n".join(lines)))
    out = tmp_path / "out"
    base = [
        "--from",
        str(root),
        "--src",
        "en",
        "--tgt",
        "de",
        "--out",
        str(out),
        "--vocab-size",
        VOCAB,
    ]
    line = error_line(cli(*base))
    assert f"{root / 'train.de.gz'}:7: not valid UTF-8" in line and "--on-bad-utf8 replace" in line
    assert not out.exists()
    result = cli(*base, "--on-bad-utf8", "replace")
    assert result.exit_code == 0, result.output
    assert open_data_dir(out).manifest["cleaning"]["bad_utf8_replaced"] == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--from", "{tmp}/nowhere", "--src", "en", "--tgt", "de"], "nowhere: no such directory"),
        (
            [
                "--train-src",
                "{tmp}/a.en",
                "--train-tgt",
                "{tmp}/a.de",
                "--src",
                "en",
                "--tgt",
                "de",
            ],
            "a.en: no such file",
        ),
        (["--from", "{corpus}", "--src", "en", "--tgt", "fr"], "has no fr partner"),
        (["--from", "{corpus}"], "needs --src and --tgt"),
        (
            ["--from", "{corpus}", "--src", "en", "--tgt", "de", "--max-len", "3"],
            "no training pairs left after cleaning (read 400; dropped: too_long",
        ),
        (
            ["--from", "{corpus}", "--src", "en", "--tgt", "de", "--vocab-size", "5000"],
            "--vocab-size 5,000 is larger than the training data supports (at most",
        ),
        (["demo", "--src", "en", "--tgt", "fr"], "demo translates en->de"),
        (["--train-src", "x"], "--train-src and --train-tgt go together"),
        (["--src", "en", "--tgt", "de"], "nothing to prepare: name a preset"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(
    m30k: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)).replace("{corpus}", str(m30k)) for a in args]
    out = tmp_path / "out"
    usage = expected.endswith("go together")  # a bad combination of options: exit code 2
    line = error_line(cli(*args, "--out", str(out)), code=2 if usage else 1)
    assert expected in line, line
    assert not out.exists()


def test_several_test_sets_need_a_choice(tmp_path: Path) -> None:
    root = text_corpus(tmp_path / "c", tests=("test_2016_flickr", "test_2017_mscoco"))
    base = ["--from", str(root), "--src", "en", "--tgt", "de", "--vocab-size", VOCAB]
    line = error_line(cli(*base, "--out", str(tmp_path / "a")))
    assert "several test file sets" in line and "test_2016_flickr, test_2017_mscoco" in line
    assert "--test-split" in line
    result = cli(*base, "--out", str(tmp_path / "b"), "--test-split", "test_2017_mscoco")
    assert result.exit_code == 0, result.output
    assert (
        open_data_dir(tmp_path / "b").manifest["source"]["files"]["test"][0]
        == "test_2017_mscoco.en.gz"
    )
    assert "no test file set named 'test_9'" in error_line(
        cli(*base, "--out", str(tmp_path / "c2"), "--test-split", "test_9")
    )


def test_a_foreign_directory_is_never_written_into(m30k: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious\n", encoding="utf-8")
    line = error_line(
        cli("--from", str(m30k), "--src", "en", "--tgt", "de", "--out", str(out), "--force")
    )
    assert "not made by nmt prepare" in line
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_readers_refuse_an_incomplete_or_inconsistent_directory(
    prepared: Path, tmp_path: Path
) -> None:
    with pytest.raises(NmtError, match="no manifest.json"):
        open_data_dir(tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in prepared.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["valid"]["pairs"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NmtError, match="split 'valid' holds 30 source and 30 target sentences"):
        open_data_dir(copy).split("valid")
    (copy / "test.tgt.idx").unlink()
    with pytest.raises(NmtError, match=r"test\.tgt\.idx is listed in the manifest but missing"):
        open_data_dir(copy)


# --- the recipe mapping ------------------------------------------------------------------


def test_data_config_maps_onto_the_engine_settings(tmp_path: Path) -> None:
    data = DataConfig(
        preset="demo",
        dir=str(tmp_path / "d"),
        vocab_size=300,
        max_pairs=500,
        dedup=True,
        test_split="t",
    )
    cfg = prepare_from_data_config(data, workers=1)
    assert (cfg.preset, cfg.out, cfg.vocab_size, cfg.max_pairs, cfg.dedup, cfg.test_split) == (
        "demo",
        str(tmp_path / "d"),
        300,
        500,
        True,
        "t",
    )
    assert (cfg.src, cfg.tgt) == ("en", "de")
    result = prepare(cfg)
    assert result.manifest["settings"]["vocab_size"] == 300
    assert (
        json.loads((tmp_path / "d" / "manifest.json").read_text())["splits"]["train"]["pairs"]
        == 500
    )
