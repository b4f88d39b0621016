"""The resumable state: the settings a data directory is being made with, and what is done.

A small JSON file in the work folder records the settings and each finished stage's
result, saved atomically after every stage (and after every binarized split). A rerun
skips what is recorded and still on disk; a rerun with other settings is refused with the
setting that differs, because mixing the stages of two configurations would give a
directory that matches neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.core.files import atomic_write_text
from nmt_cli.engines.prepare.cleaning import Cleaned
from nmt_cli.engines.prepare.layout import Layout
from nmt_cli.engines.prepare.progress import STAGES
from nmt_cli.engines.prepare.vocabulary import Vocabulary
from nmt_cli.errors import NmtError


@dataclass
class PrepareState:
    """The work folder's record of settings and finished stages (JSON-ready values)."""

    path: Path
    settings: dict[str, Any]
    done: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> PrepareState | None:
        """The state a previous run left at `path`; None if there is none or it is unreadable."""
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return None
        return cls(path, raw["settings"], raw.get("done", {}))

    def save(self) -> None:
        text = json.dumps({"settings": self.settings, "done": self.done}, indent=2)
        atomic_write_text(self.path, text + "\n")

    @property
    def cleaned(self) -> Cleaned | None:
        raw = self.done.get("clean")
        return Cleaned.from_json(raw) if raw else None

    @property
    def vocabulary(self) -> Vocabulary | None:
        raw = self.done.get("vocab")
        return Vocabulary.from_json(raw) if raw else None

    @property
    def binarized(self) -> dict[str, dict[str, int]]:
        """Token counts of each split already encoded."""
        return dict(self.done.get("binarize", {}))

    def redo(self, stage: str) -> None:
        """Forget `stage` and every later one: a stage that runs again changes their input."""
        for later in STAGES[STAGES.index(stage) :]:
            self.done.pop(later, None)

    def finish(self, stage: str, result: dict[str, Any]) -> None:
        self.done[stage] = result
        self.save()

    def finish_split(self, split: str, counts: dict[str, int]) -> None:
        """One binarized split: recorded at once, so a kill loses at most the split in work."""
        self.done.setdefault("binarize", {})[split] = counts
        self.save()

    def forget_missing(self, layout: Layout) -> None:
        """A finished stage whose files are gone is not finished."""
        cleaned = self.cleaned
        if cleaned and not layout.has_cleaned(list(cleaned.splits)):
            self.done.pop("clean")
        vocabulary = self.vocabulary
        if vocabulary and not all((layout.out / f).is_file() for f in vocabulary.files):
            self.done.pop("vocab")
        for split in self.binarized:
            if not layout.has_stores(split):
                self.done["binarize"].pop(split)


def refuse_other_settings(out: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    """A directory made with other settings is not resumed: name every setting that differs."""
    diffs = [
        f"{key} {before.get(key)!r} -> {now.get(key)!r}"
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    ]
    if diffs:
        raise NmtError(
            f"{out} was prepared with other settings ({'; '.join(diffs)}); "
            "rerun with --force to prepare it again, or choose another --out"
        )


def refuse_other_heldout(out: Path, source: dict[str, Any], valid: str, test: str) -> None:
    """--valid-split/--test-split must name the files the directory was made from.

    They are not among the compared settings: naming the dev or test set that would have
    been chosen anyway (Multi30k's test_2016_flickr, say) is not a change.
    """
    files = source.get("files", {})
    for role, choice in (("valid", valid), ("test", test)):
        chosen = Path(files[role][0]).name.split(".")[0] if files.get(role) else ""
        if choice and chosen and choice != chosen:
            raise NmtError(
                f"{out} was prepared with the {role} set '{chosen}', not '{choice}'; "
                "rerun with --force to prepare it again, or choose another --out"
            )
