"""Each prepare stage on its own: explicit inputs in, files and a result object out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nmt_cli.core.data import TokenStore
from nmt_cli.data_dir import MANIFEST, open_data_dir
from nmt_cli.engines.prepare.binarize import BinarizeInputs, EncodeCounts, binarize
from nmt_cli.engines.prepare.cleaning import Cleaned, CleanInputs, CleanRules, clean
from nmt_cli.engines.prepare.demo_corpus import generate_pair
from nmt_cli.engines.prepare.layout import Layout
from nmt_cli.engines.prepare.manifest import ManifestInputs, write_manifest
from nmt_cli.engines.prepare.progress import StageEvent
from nmt_cli.engines.prepare.sources import Corpus, ListPairs
from nmt_cli.engines.prepare.vocabulary import VocabInputs, Vocabulary, build_vocabulary
from nmt_cli.errors import NmtError

VOCAB = 150


def corpus(train: list[tuple[str, str]] | None = None) -> Corpus:
    splits = {
        "train": ListPairs(
            train if train is not None else [generate_pair(5, i) for i in range(300)]
        ),
        "valid": ListPairs([generate_pair(5, 1000 + i) for i in range(20)] + [("", "x")]),
    }
    return Corpus("en", "de", dict(splits), {"kind": "test"})


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def cleaned_in(tmp_path: Path, **kw: Any) -> Cleaned:
    return clean(CleanInputs(corpus(), CleanRules(), **kw), Layout(tmp_path), [].append)


def test_clean_filters_train_keeps_heldout_whole_and_counts(tmp_path: Path) -> None:
    train = [("a b", "c d"), ("", "x"), ("a", "b c d e"), ("e f", "g h")]
    events: list[StageEvent] = []
    layout = Layout(tmp_path)
    result = clean(CleanInputs(corpus(train), CleanRules()), layout, events.append)
    assert lines(layout.cleaned("train", "src")) == ["a b", "e f"]
    assert lines(layout.cleaned("train", "tgt")) == ["c d", "g h"]
    assert result.splits["train"]["dropped"] == {
        "empty": 1,
        "too_long": 0,
        "ratio": 1,
        "duplicate": 0,
    }
    # held-out sets are never filtered: the empty pair stays, raw text kept for scoring
    assert result.kept("valid") == 21 and lines(layout.raw_text("valid", "src"))[-1] == ""
    assert result.pairs == 4 + 21
    assert [(e.kind, e.label) for e in events if e.kind != "advance"] == [
        ("start", "clean train"), ("end", "clean train"),
        ("start", "clean valid"), ("end", "clean valid"),
    ]  # fmt: skip
    assert Cleaned.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_clean_max_pairs_takes_a_prefix_or_a_seeded_sample(tmp_path: Path) -> None:
    prefix = cleaned_in(tmp_path / "a", max_pairs=50)
    assert prefix.splits["train"]["read"] == 50
    first = lines(Layout(tmp_path / "a").cleaned("train", "src"))
    assert first[0] == generate_pair(5, 0)[0]
    sample = cleaned_in(tmp_path / "b", max_pairs=50, sample_max_pairs=True, seed=3)
    assert sample.splits["train"]["read"] == 50
    again = cleaned_in(tmp_path / "c", max_pairs=50, sample_max_pairs=True, seed=3)
    assert again == sample
    sampled = lines(Layout(tmp_path / "b").cleaned("train", "src"))
    assert sampled == lines(Layout(tmp_path / "c").cleaned("train", "src")) != first


def test_clean_refuses_an_empty_training_set_and_names_the_rules(tmp_path: Path) -> None:
    events: list[StageEvent] = []
    with pytest.raises(NmtError, match=r"no training pairs left .*dropped: empty 2"):
        clean(
            CleanInputs(corpus([("", "a"), ("b", "")]), CleanRules()),
            Layout(tmp_path),
            events.append,
        )
    assert ("end", "clean train") not in [(e.kind, e.label) for e in events]


@pytest.mark.parametrize("joint", [True, False])
def test_vocabulary_joint_or_one_model_per_language(tmp_path: Path, joint: bool) -> None:
    cleaned = cleaned_in(tmp_path)
    inputs = VocabInputs(cleaned.kept("train"), VOCAB, 1.0, joint, 1000, seed=1)
    vocabulary = build_vocabulary(inputs, Layout(tmp_path), [].append)
    expected = ("spm.model",) if joint else ("spm.src.model", "spm.tgt.model")
    assert vocabulary.files == expected and vocabulary.joint is joint
    assert all((tmp_path / name).is_file() for name in expected)
    # the sample is bounded: 1000 lines are 500 pairs for a joint model, all 300 here
    assert vocabulary.sample_pairs == vocabulary.pairs == 300
    first = (tmp_path / vocabulary.src_model).read_bytes()
    build_vocabulary(inputs, Layout(tmp_path), [].append)
    assert (tmp_path / vocabulary.src_model).read_bytes() == first  # deterministic
    assert Vocabulary.from_json(json.loads(json.dumps(vocabulary.to_json()))) == vocabulary


def test_vocabulary_too_large_for_the_data_says_what_to_pass(tmp_path: Path) -> None:
    cleaned = cleaned_in(tmp_path)
    inputs = VocabInputs(cleaned.kept("train"), 50_000, 1.0, True, 1000, seed=1)
    with pytest.raises(NmtError, match=r"--vocab-size 50,000 is larger .* pass --vocab-size \d+"):
        build_vocabulary(inputs, Layout(tmp_path), [].append)


def built(tmp_path: Path) -> tuple[Cleaned, Vocabulary, dict[str, EncodeCounts]]:
    cleaned = cleaned_in(tmp_path)
    layout = Layout(tmp_path)
    inputs = VocabInputs(cleaned.kept("train"), VOCAB, 1.0, True, 1000, seed=1)
    vocabulary = build_vocabulary(inputs, layout, [].append)
    recorded: dict[str, EncodeCounts] = {}
    todo = {split: cleaned.kept(split) for split in cleaned.splits}
    pairs = binarize(
        BinarizeInputs(todo, vocabulary, VOCAB), layout, [].append, recorded.__setitem__
    )
    assert pairs == sum(todo.values())
    return cleaned, vocabulary, recorded


def test_binarize_writes_each_split_and_records_it(tmp_path: Path) -> None:
    cleaned, _, recorded = built(tmp_path)
    assert list(recorded) == ["train", "valid"]
    for split, counts in recorded.items():
        src = TokenStore(Layout(tmp_path).store(split, "src"))
        assert len(src) == counts.pairs == cleaned.kept(split)
        assert int(src.lengths.sum()) == counts.src_tokens


def test_binarize_only_the_splits_it_is_given(tmp_path: Path) -> None:
    cleaned, vocabulary, _ = built(tmp_path)
    recorded: list[str] = []
    inputs = BinarizeInputs({"valid": cleaned.kept("valid")}, vocabulary, VOCAB)
    binarize(inputs, Layout(tmp_path), [].append, lambda split, _: recorded.append(split))
    assert recorded == ["valid"]


def test_manifest_checksums_every_output_and_opens(tmp_path: Path) -> None:
    cleaned, vocabulary, recorded = built(tmp_path)
    binarized = {split: vars(counts) for split, counts in recorded.items()}
    settings = {"vocab_size": VOCAB}
    manifest = write_manifest(
        ManifestInputs(settings, cleaned, vocabulary, binarized), Layout(tmp_path), [].append
    )
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    assert sorted(manifest["files"]) == sorted(
        [
            "spm.model",
            *Layout(tmp_path).output_files("train"),
            *Layout(tmp_path).output_files("valid"),
        ]
    )
    data = open_data_dir(tmp_path)
    assert data.changed_files() == [] and data.splits == ["train", "valid"]
    assert manifest["cleaning"]["held_out_filtered"] is False and manifest["vocab"]["joint"]
