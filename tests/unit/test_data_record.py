"""What a run trains on is what its data directory holds (engines/train/data_record.py):
other languages are refused, and the vocabulary settings and a treebank's tree leaves are
taken from the directory into the recipe the checkpoints record, with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from nmt_cli.config import load_recipe
from nmt_cli.core.vocab import VocabPair
from nmt_cli.data_dir import PreparedData
from nmt_cli.engines.train.data_record import reconcile
from nmt_cli.errors import NmtError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ptb-sample-parsing.toml"


def directory(source: dict[str, Any], src: str = "en", tgt: str = "tree") -> PreparedData:
    manifest = {"src": src, "tgt": tgt, "vocab": {"size": 4000, "joint": True}}
    return PreparedData(Path("data"), {**manifest, "source": source}, cast(VocabPair, None))


@pytest.mark.parametrize("recipe_leaves", ["xx", "words"])
@pytest.mark.parametrize("data_leaves", ["xx", "words", None])
def test_the_directory_decides_a_treebanks_leaves(
    recipe_leaves: str, data_leaves: str | None
) -> None:
    recipe = load_recipe(RECIPE, [f"data.tree_leaves={recipe_leaves}"])
    source = {"kind": "treebank"} | ({"tree_leaves": data_leaves} if data_leaves else {})
    done = reconcile(recipe, directory(source))
    have = data_leaves or "xx"  # a directory from before the setting holds XX leaves
    assert done.recipe.data.tree_leaves == have
    warned = [w for w in done.warnings if "data.tree_leaves" in w]
    assert len(warned) == (recipe_leaves != have)
    if warned:
        assert f"is {recipe_leaves} but data was prepared with {have}" in warned[0]


def test_a_translation_corpus_has_no_leaves_and_other_languages_are_refused() -> None:
    recipe = load_recipe(RECIPE, ["data.tree_leaves=words"])
    assert reconcile(recipe, directory({"kind": "preset"})).recipe.data.tree_leaves == "words"
    with pytest.raises(NmtError, match="holds en->de data"):
        reconcile(recipe, directory({"kind": "preset"}, tgt="de"))
