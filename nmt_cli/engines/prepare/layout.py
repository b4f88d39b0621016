"""The names of everything `nmt prepare` writes, in the data directory and its work folder.

One place decides every file name, so the stages that write files, the check that a
finished stage's files are still there, the manifest's checksum list and `--force`'s
clean-up can never disagree about what belongs to prepare. The data directory's own
contract (what readers may rely on) is `nmt_cli/data_dir.py`; the work folder is private
to prepare and removed once the manifest is written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.data_dir import MANIFEST

SPLITS = ("train", "valid", "test")  # in the order every stage handles them
WORK = ".prepare"  # work folder inside the data directory, removed once complete
STATE = "state.json"
LOCK = "prepare.lock"  # held while a prepare runs (see nmt_cli/dir_lock.py)
SIDES = ("src", "tgt")
VOCAB_MODELS = ("spm.model", "spm.src.model", "spm.tgt.model")


@dataclass(frozen=True)
class Layout:
    """The paths of one data directory `out` and of its work folder."""

    out: Path

    @property
    def work(self) -> Path:
        return self.out / WORK

    @property
    def lock_file(self) -> Path:
        return self.out / LOCK

    @property
    def state_file(self) -> Path:
        return self.work / STATE

    def cleaned(self, split: str, side: str) -> Path:
        """Cleaned (and normalized) text of a split, one side: what binarize encodes."""
        return self.work / f"{split}.{side}"

    def raw_text(self, split: str, side: str) -> Path:
        """The untouched dev/test text kept for scoring against the real references."""
        return self.out / f"{split}.{side}.txt"

    def store(self, split: str, side: str) -> Path:
        """Prefix of a token store (.bin + .idx, see core/data.py)."""
        return self.out / f"{split}.{side}"

    def store_files(self, split: str) -> list[str]:
        return [f"{self.store(split, side).name}.{ext}" for side in SIDES for ext in ("bin", "idx")]

    def output_files(self, split: str) -> list[str]:
        """The names a finished split has in the data directory (vocabularies aside)."""
        if split == "train":
            return self.store_files(split)
        return self.store_files(split) + [self.raw_text(split, side).name for side in SIDES]

    def has_cleaned(self, splits: list[str]) -> bool:
        return all(self.cleaned(s, side).is_file() for s in splits for side in SIDES)

    def has_stores(self, split: str) -> bool:
        return all((self.out / name).is_file() for name in self.store_files(split))

    # housekeeping

    def only_ours(self) -> bool:
        """Whether everything in `out` is something prepare writes (or a temporary of it)."""
        names = _our_names() | {LOCK}
        return all(p.name in names or p.name.endswith(".tmp") for p in self.out.iterdir())

    def wipe(self) -> None:
        """--force: remove what a previous prepare wrote here, and nothing else."""
        for name in _our_names():
            path = self.out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        self.remove_temporaries()

    def remove_temporaries(self) -> None:
        """Temporary files of a killed run (atomic writes that never got renamed)."""
        for folder in (self.out, self.work):
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)

    def remove_work(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _our_names() -> set[str]:
    names = {MANIFEST, WORK, *VOCAB_MODELS}
    for split in SPLITS:
        names |= {f"{split}.{side}.{ext}" for side in SIDES for ext in ("bin", "idx", "txt")}
    return names
