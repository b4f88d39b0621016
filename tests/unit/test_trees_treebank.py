"""The treebank presets: WSJ files split by number, read from a zip or a folder, each
sentence a (words, gold tree) pair whose target the model learns is its linearization."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from nmt_cli.engines.prepare.treebank import (
    PTB,
    PTB_SAMPLE,
    read_treebank,
    target_form,
)
from nmt_cli.errors import NmtError

TREES = {
    1: "( (S (NP-SBJ (NNP John)) (VP (VBZ runs)) (. .)) )\n( (S (NP-SBJ (PRP He)) "
    "(VP (VBD left) (NP (-NONE- *T*-1)))) )\n",
    159: "( (S (NP-SBJ (DT The) (NN dog)) (VP (VBZ barks))) )\n",
    160: "( (S (NP-SBJ (PRP It)) (VP (VBD rained))) )\n",
    180: "( (S (NP-SBJ (NNP Mary)) (VP (VBZ sings) (ADVP (RB well)))) )\n",
    200: "( (S (NP-SBJ (NNP Ignored)) (VP (VBZ here))) )\n",  # beyond the sample's files
}


def write_zip(path: Path, trees: dict[int, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("treebank/combined/README", "not a tree file")
        for number, text in trees.items():
            archive.writestr(f"treebank/combined/wsj_{number:04d}.mrg", text)
            archive.writestr(f"treebank/tagged/wsj_{number:04d}.pos", "[ John/NNP ]")
    return path


def test_the_sample_is_split_by_file_number_into_words_and_gold_trees(tmp_path: Path) -> None:
    read = read_treebank(PTB_SAMPLE, str(write_zip(tmp_path / "tb.zip", TREES)), "")
    assert {split: len(pairs) for split, pairs in read.pairs.items()} == {
        "train": 3, "valid": 1, "test": 1,
    }  # fmt: skip
    words, gold = read.pairs["train"][1]
    assert words == "He left"  # the trace is no word
    assert gold == "(TOP (S (NP-SBJ (PRP He)) (VP (VBD left) (NP (-NONE- *T*-1)))))"
    assert target_form(gold) == "(S (NP XX )NP (VP XX )VP )S"
    assert read.pairs["test"] == [
        ("Mary sings well", "(TOP (S (NP-SBJ (NNP Mary)) (VP (VBZ sings) (ADVP (RB well)))))")
    ]
    assert read.whole_words == ("(NP", "(S", "(VP", ")NP", ")S", ")VP", "XX")  # train only
    assert read.info["kind"] == "treebank" and read.info["name"] == "ptb-sample"
    assert read.info["splits"]["train"] == {"files": 2, "sentences": 3}
    assert len(read.info["sha256"]) == 64 and read.info["tree_leaves"] == "xx"


def test_word_leaves_keep_only_brackets_whole_and_are_recorded(tmp_path: Path) -> None:
    read = read_treebank(PTB_SAMPLE, str(write_zip(tmp_path / "tb.zip", TREES)), "", "words")
    assert read.whole_words == ("(NP", "(S", "(VP", ")NP", ")S", ")VP")  # no XX
    assert read.info["tree_leaves"] == "words"
    gold = read.pairs["train"][1][1]
    assert target_form(gold, "words") == "(S (NP He )NP (VP left )VP )S"
    with pytest.raises(NmtError, match="tree leaves must be one of xx, words"):
        read_treebank(PTB_SAMPLE, str(tmp_path / "tb.zip"), "", "tags")


def test_an_unpacked_folder_reads_like_the_zip(tmp_path: Path) -> None:
    folder = tmp_path / "wsj"
    for number, text in TREES.items():
        section = folder / f"{number // 100:02d}"
        section.mkdir(parents=True, exist_ok=True)
        (section / f"wsj_{number:04d}.mrg").write_text(text)
    zipped = read_treebank(PTB_SAMPLE, str(write_zip(tmp_path / "tb.zip", TREES)), "")
    assert read_treebank(PTB_SAMPLE, str(folder), "").pairs == zipped.pairs
    # the full WSJ's split puts file 200 (section 02) into train and the rest nowhere
    with pytest.raises(NmtError, match="no valid trees for ptb"):
        read_treebank(PTB, str(folder), "")


def test_what_cannot_be_a_treebank_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NmtError, match="licensed Penn Treebank: pass --from DIR"):
        read_treebank(PTB, "", "")
    with pytest.raises(NmtError, match="no such file"):
        read_treebank(PTB_SAMPLE, str(tmp_path / "missing.zip"), "")
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(NmtError, match="not a zip archive"):
        read_treebank(PTB_SAMPLE, str(tmp_path / "junk.zip"), "")
    broken = write_zip(tmp_path / "broken.zip", {**TREES, 2: "( (S (NP (NN a)) )\n"})
    with pytest.raises(NmtError, match=r"wsj_0002.mrg: not well-formed .*unclosed"):
        read_treebank(PTB_SAMPLE, str(broken), "")
    no_dev = write_zip(tmp_path / "nodev.zip", {1: TREES[1]})
    with pytest.raises(NmtError, match=r"no valid trees for ptb-sample \(files wsj_0160"):
        read_treebank(PTB_SAMPLE, str(no_dev), "")


def test_the_presets_splits_are_the_documented_ones() -> None:
    assert [PTB.split_of(n) for n in (199, 200, 2199, 2200, 2299, 2300, 2399, 2400)] == [
        "", "train", "train", "valid", "valid", "test", "test", "",
    ]  # fmt: skip
    assert [PTB_SAMPLE.split_of(n) for n in (1, 159, 160, 179, 180, 199, 200)] == [
        "train", "train", "valid", "valid", "test", "test", "",
    ]  # fmt: skip
