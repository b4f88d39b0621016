"""What a run was trained on: the recipe's [data] checked against the data directory,
and the directory's manifest recorded in the run directory.

The recipe names a data directory, but the directory decides what is trained: its
languages, its vocabulary, its sentences. A recipe whose [data] says en->de pointed (by
`--set data.dir=...`) at an en->fr directory would train an en->fr model and record
"de" in config.json. So languages that disagree are refused, vocabulary settings (and a
treebank's tree leaves, which decoding reads from the checkpoint's recipe) that disagree
are reported and recorded as the directory has them, and `data.json` in the run
directory keeps the manifest's languages, vocabulary, counts and checksums. A resumed
run whose directory now holds other data (other checksums) is refused: its data position
and schedule would silently apply to different sentences.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from nmt_cli.config import RecipeConfig
from nmt_cli.data_dir import PreparedData
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.errors import NmtError


@dataclass(frozen=True)
class Reconciled:
    recipe: RecipeConfig  # with [data] as the directory has it
    warnings: list[str]


def reconcile(recipe: RecipeConfig, data: PreparedData) -> Reconciled:
    """Refuse other languages; take the directory's vocabulary settings and tree leaves,
    with a warning."""
    want = (recipe.data.src, recipe.data.tgt)
    have = (data.src_lang, data.tgt_lang)
    if want != have:
        raise NmtError(
            f"{data.root} holds {have[0]}->{have[1]} data but the recipe's [data] says "
            f"{want[0]}->{want[1]}; set data.src and data.tgt to match (--set data.src="
            f"{have[0]} --set data.tgt={have[1]}) or point data.dir at {want[0]}->{want[1]} data"
        )
    vocab = data.manifest.get("vocab", {})
    found = {"vocab_size": vocab.get("size"), "joint_vocab": vocab.get("joint")}
    source = data.manifest.get("source", {})
    if source.get("kind") == "treebank":  # directories from before the setting hold XX
        found["tree_leaves"] = source.get("tree_leaves", "xx")
    changes: dict[str, Any] = {}
    warnings = []
    for key, value in found.items():
        if value is not None and getattr(recipe.data, key) != value:
            warnings.append(
                f"the recipe's data.{key} is {getattr(recipe.data, key)} but {data.root} was "
                f"prepared with {value}; training uses the directory's, and config.json "
                "records it"
            )
            changes[key] = value
    if not changes:
        return Reconciled(recipe, [])
    data_cfg = dataclasses.replace(recipe.data, **changes)
    return Reconciled(dataclasses.replace(recipe, data=data_cfg), warnings)


def data_record(data: PreparedData) -> dict[str, Any]:
    """The part of the manifest that says what was trained on."""
    m = data.manifest
    return {
        "dir": str(data.root.resolve()),
        "src": data.src_lang,
        "tgt": data.tgt_lang,
        "vocab": m.get("vocab", {}),
        "splits": m.get("splits", {}),
        "source": m.get("source", {}),
        "files": m.get("files", {}),
    }


def refuse_other_data(run: RunDir, data: PreparedData) -> None:
    """A run directory records its data; resuming it on different data is refused."""
    path = run.data_record
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # unreadable: the checkpoint's own checks still apply
    new = data_record(data)
    changed = sorted(
        name
        for name in {*old.get("files", {}), *new["files"]}
        if old.get("files", {}).get(name) != new["files"].get(name)
    )
    if changed:
        shown = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
        raise NmtError(
            f"{run.root} was trained on other data ({old.get('dir', '?')}, "
            f"{old.get('src', '?')}->{old.get('tgt', '?')}): {data.root} differs in {shown}; "
            "train into a new --run-dir, or point data.dir back at that data"
        )
