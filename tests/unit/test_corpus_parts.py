"""A corpus translated on many machines, without the machines: the input read as numbered
blocks (corpus_input.py) and the directory of parts that makes a stopped job resumable
and a retried block written once (corpus_parts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nmt_cli.engines.translate.corpus_input import Corpus
from nmt_cli.engines.translate.corpus_parts import (
    JOB,
    JOURNAL,
    MANIFEST,
    BlockRecord,
    PartsDir,
    in_order,
)
from nmt_cli.errors import NmtError
from nmt_cli.text_io import LineDecoder

JOB_A = {"inputs": ["a"], "decode": {"beam_size": 4}}


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_blocks_run_across_files_with_lines_counted_over_all(tmp_path: Path) -> None:
    a = write(tmp_path / "a.txt", b"one\ntwo\nthree\n")
    b = write(tmp_path / "b.txt", b"four\n\nsix\nseven\n")
    corpus = Corpus([a, b])
    blocks = list(corpus.blocks(3))
    assert [(k.index, k.first_line, k.lines) for k in blocks] == [
        (0, 1, ["one", "two", "three"]),
        (1, 4, ["four", "", "six"]),
        (2, 7, ["seven"]),
    ]
    assert corpus.line_counts == [3, 4]
    assert corpus.resumable and not Corpus([Path("-")]).resumable


def test_a_bad_line_names_its_own_file_and_line(tmp_path: Path) -> None:
    a = write(tmp_path / "a.txt", b"one\ntwo\n")
    b = write(tmp_path / "b.txt", b"ok\n\xff bad\n")
    with pytest.raises(NmtError, match=r"b\.txt:2: not valid UTF-8"):
        list(Corpus([a, b]).blocks(10))
    corpus = Corpus([a, b], LineDecoder("replace"))
    assert [k.lines for k in corpus.blocks(10)] == [["one", "two", "ok", "\ufffd bad"]]
    assert "b.txt:2" in corpus.decoder.warning()


def record(block: int, first_line: int, data: bytes, lines: int = 2) -> BlockRecord:
    return BlockRecord.of(data, block=block, first_line=first_line, lines=lines)


def test_written_blocks_are_those_whose_part_and_journal_line_agree(tmp_path: Path) -> None:
    root = tmp_path / "parts"
    parts = PartsDir(root, JOB_A, ".txt", "--output")
    with parts.opened(resume=False):
        parts.write(record(0, 1, b"a\nb\n"), b"a\nb\n")
        parts.write(record(1, 3, b"c\nd\n"), b"c\nd\n")
        parts.write(record(2, 5, b"e\nf\n"), b"e\nf\n")
        parts.part(1).write_bytes(b"c\n")  # a part not as the journal says: written again
        with open(root / JOURNAL, "a") as fh:
            fh.write('{"block": 3, "first_')  # torn by a kill
        assert sorted(parts.done()) == [0, 2]
        assert parts.done()[2] == record(2, 5, b"e\nf\n")
        assert (root / "translate.lock").exists()  # held while open
    assert not (root / "translate.lock").exists()


def test_a_stopped_job_is_continued_only_with_resume_and_only_the_same_job(
    tmp_path: Path,
) -> None:
    root = tmp_path / "parts"
    with PartsDir(root, JOB_A, ".txt", "--output").opened(resume=False) as parts:
        parts.write(record(0, 1, b"a\nb\n"), b"a\nb\n")
    with (
        pytest.raises(NmtError, match=r"1 block\(s\) written\): pass --resume"),
        PartsDir(root, JOB_A, ".txt", "--output").opened(resume=False),
    ):
        pass
    other = {**JOB_A, "decode": {"beam_size": 2}}
    with (
        pytest.raises(NmtError, match="other inputs, models or settings"),
        PartsDir(root, other, ".txt", "--output").opened(resume=True),
    ):
        pass
    with PartsDir(root, JOB_A, ".txt", "--output").opened(resume=True) as parts:
        assert sorted(parts.done()) == [0]


def test_a_job_that_wrote_nothing_starts_again_without_resume(tmp_path: Path) -> None:
    root = tmp_path / "parts"
    with PartsDir(root, JOB_A, ".txt", "--output").opened(resume=False) as parts:
        (root / JOURNAL).write_text('{"torn')
    other = {**JOB_A, "decode": {"beam_size": 2}}
    with PartsDir(root, other, ".txt", "--output").opened(resume=False) as parts:
        assert not (root / JOURNAL).exists()
        assert json.loads((root / JOB).read_text()) == other
        assert parts.done() == {}


def test_a_directory_holding_something_else_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "parts"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    with (
        pytest.raises(NmtError, match=r"not empty \(notes\.txt"),
        PartsDir(root, JOB_A, ".txt", "--output").opened(resume=True),
    ):
        pass
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]


def test_the_manifest_completes_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "parts"
    with PartsDir(root, JOB_A, ".jsonl", "--output").opened(resume=False) as parts:
        for k, data in enumerate([b"a\nb\n", b"c\nd\n", b"e\n"]):
            parts.write(record(k, 2 * k + 1, data, lines=data.count(b"\n")), data)
        ordered = in_order(parts.done(), 5)
        parts.write_manifest(ordered, [{"path": "in.txt", "lines": 5}])
    assert sorted(p.name for p in root.iterdir()) == [
        MANIFEST,
        "part-000000.jsonl",
        "part-000001.jsonl",
        "part-000002.jsonl",
    ]
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["lines"] == 5 and manifest["job"] == JOB_A
    assert [(p["file"], p["first_line"], p["lines"]) for p in manifest["parts"]] == [
        ("part-000000.jsonl", 1, 2),
        ("part-000001.jsonl", 3, 2),
        ("part-000002.jsonl", 5, 1),
    ]
    # --resume on a finished job has nothing left to do; without it, or for another
    # job, the directory is refused rather than overwritten.
    with PartsDir(root, JOB_A, ".jsonl", "--output").opened(resume=True) as parts:
        assert parts.finished and sorted(parts.done()) == [0, 1, 2]
    for job, resume in ((JOB_A, False), ({"other": 1}, True)):
        with (
            pytest.raises(NmtError, match="holds a finished translation"),
            PartsDir(root, job, ".jsonl", "--output").opened(resume=resume),
        ):
            pass


def test_in_order_refuses_a_gap_or_a_short_output() -> None:
    records = {0: record(0, 1, b"x"), 2: record(2, 5, b"y")}
    with pytest.raises(NmtError, match="block 1 of the translation is missing"):
        in_order(records, 6)
    with pytest.raises(NmtError, match="has 2 lines, the input 3"):
        in_order({0: record(0, 1, b"x")}, 3)
    assert [r.block for r in in_order({1: record(1, 3, b"y"), 0: record(0, 1, b"x")}, 4)] == [
        0,
        1,
    ]
