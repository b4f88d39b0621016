"""The resumable state of `nmt prepare` and the checks that guard a rerun."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt_cli.engines.prepare.cleaning import Cleaned
from nmt_cli.engines.prepare.layout import Layout
from nmt_cli.engines.prepare.state import (
    PrepareState,
    refuse_other_heldout,
    refuse_other_settings,
)
from nmt_cli.engines.prepare.vocabulary import Vocabulary
from nmt_cli.errors import NmtError

CLEANED = Cleaned("en", "de", {"kind": "test"}, 1.0, {"train": {"read": 2, "kept": 2}}, 0)
VOCABULARY = Vocabulary(("spm.model",), 2)


def full_state(layout: Layout) -> PrepareState:
    state = PrepareState(layout.state_file, {"seed": 1})
    state.finish("clean", CLEANED.to_json())
    state.finish("vocab", VOCABULARY.to_json())
    state.finish_split("train", {"pairs": 2})
    return state


def test_state_survives_a_reload_and_reads_back_typed(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    full_state(layout)
    loaded = PrepareState.load(layout.state_file)
    assert loaded is not None and loaded.settings == {"seed": 1}
    assert loaded.cleaned == CLEANED and loaded.vocabulary == VOCABULARY
    assert loaded.binarized == {"train": {"pairs": 2}}


def test_no_state_or_a_torn_one_means_start_afresh(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert PrepareState.load(layout.state_file) is None
    layout.work.mkdir()
    layout.state_file.write_text('{"settings": {', encoding="utf-8")
    assert PrepareState.load(layout.state_file) is None


def test_redoing_a_stage_forgets_every_later_one(tmp_path: Path) -> None:
    state = full_state(Layout(tmp_path))
    state.redo("vocab")
    assert state.cleaned == CLEANED and state.vocabulary is None and state.binarized == {}
    state.redo("clean")
    assert state.done == {}


def test_a_stage_whose_files_are_gone_is_not_done(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    state = full_state(layout)
    state.forget_missing(layout)  # nothing was written: nothing stands
    assert state.done == {"binarize": {}}
    state = full_state(layout)
    for side in ("src", "tgt"):
        layout.cleaned("train", side).write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "spm.model").write_bytes(b"model")
    state.forget_missing(layout)
    assert state.cleaned == CLEANED and state.vocabulary == VOCABULARY
    assert state.binarized == {}


def test_other_settings_are_refused_by_name(tmp_path: Path) -> None:
    refuse_other_settings(tmp_path, {"seed": 1}, {"seed": 1})
    with pytest.raises(NmtError, match=r"other settings \(dedup False -> True; seed 1 -> 2\)"):
        refuse_other_settings(tmp_path, {"seed": 1, "dedup": False}, {"seed": 2, "dedup": True})


def test_naming_another_heldout_set_is_refused_but_the_same_one_is_not(tmp_path: Path) -> None:
    source = {"files": {"test": ["test_2016_flickr.en.gz", "test_2016_flickr.de.gz"]}}
    refuse_other_heldout(tmp_path, source, "", "test_2016_flickr")
    refuse_other_heldout(tmp_path, source, "val", "")  # no valid files recorded: no check
    with pytest.raises(NmtError, match="the test set 'test_2016_flickr', not 'test_2017'"):
        refuse_other_heldout(tmp_path, source, "", "test_2017")
