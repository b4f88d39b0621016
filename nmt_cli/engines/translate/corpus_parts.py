"""The directory of parts a corpus translation writes, one file per block, and its manifest.

Blocks come back from the machines in any order and a machine may die halfway through
one (its block is then translated again elsewhere), so every finished block is written
on its own, atomically, as `part-NNNNNN<suffix>`, named by its index: a block translated
twice is one file written twice with the same bytes, and every line is there once. After
the part, a line is appended to `blocks.jsonl` (the journal: what the block holds and
where it was translated); a block counts as written when both are there and the part has
the size the journal says. `job.json` says what is being translated (inputs, models,
settings), so `--resume` continues only the same job. When every block is in:

- an output directory (`--parts`) gets `manifest.json`, written last as in a data
  directory (its presence means complete): the parts in input order with their first
  line, line count, size and SHA-256, the inputs' line counts and the job; the journal
  and `job.json` go;
- an output file is the parts joined in order (`concatenate`, through `outputs.py`),
  and the directory, a staging area beside it, goes.

One writer at a time (`DirLock`); the lock goes when the writer stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from nmt_cli.core.files import atomic_write_bytes, atomic_write_text
from nmt_cli.dir_lock import DirLock
from nmt_cli.errors import NmtError
from nmt_cli.version import __version__

FORMAT = "nmt-translation-parts"
MANIFEST, JOB, JOURNAL, LOCK = "manifest.json", "job.json", "blocks.jsonl", "translate.lock"


@dataclass(frozen=True)
class BlockRecord:
    """One translated block: where its lines are, what was decoded, and by whom."""

    block: int
    first_line: int  # 1-based, over all inputs
    lines: int
    size: int  # bytes of its part
    sha256: str
    sentences: int = 0  # non-empty lines
    target_tokens: int = 0  # of the best hypotheses
    truncated: int = 0
    truncated_lines: list[int] = field(default_factory=list)  # the block's first few
    decode_seconds: float = 0.0
    node: str = ""
    pid: int = 0
    precision: str = ""  # what the node resolved the setting to
    threads: int = 1
    max_source: int = 0  # subword tokens a source keeps (for the truncation warning)
    notes: list[str] = field(default_factory=list)  # e.g. why the Python step decoded

    @classmethod
    def of(cls, data: bytes, **fields: Any) -> BlockRecord:
        """The record of a block whose output is `data`."""
        return cls(size=len(data), sha256=hashlib.sha256(data).hexdigest(), **fields)


class PartsDir:
    """`root`, holding (or to hold) the parts of the job described by `job`."""

    def __init__(self, root: Path, job: dict[str, Any], suffix: str, option: str) -> None:
        self.root, self.job, self.suffix, self.option = root, job, suffix, option
        self.finished = False  # a manifest of this very job is there already

    def part(self, block: int) -> Path:
        return self.root / f"part-{block:06d}{self.suffix}"

    @contextlib.contextmanager
    def opened(self, resume: bool) -> Iterator[PartsDir]:
        """Hold the lock; check that `root` is this job's (or new, or empty) and note it."""
        if self.root.exists() and not self.root.is_dir():
            raise NmtError(f"{self.option} {self.root}: exists and is not a directory")
        with DirLock(self.root / LOCK, "nmt translate --ray", self.option):
            if not self._check(resume) and not self.finished:
                (self.root / JOURNAL).unlink(missing_ok=True)  # a start with nothing kept
            if not self.finished:
                atomic_write_text(self.root / JOB, json.dumps(self.job, indent=1) + "\n")
            yield self

    def _check(self, resume: bool) -> bool:
        """Whether the blocks of a stopped run of this job are to be kept; refuses a
        directory that holds anything else worth keeping."""
        manifest, job = self.root / MANIFEST, self.root / JOB
        if manifest.exists():
            if resume and _read_json(manifest).get("job") == self.job:
                self.finished = True
                return True
            raise NmtError(
                f"{self.root} holds a finished translation ({MANIFEST})"
                + (" of other inputs or settings" if resume else "")
                + f"; remove it or choose another {self.option}"
            )
        if job.exists():
            count = len(self.done())
            if not resume and count:
                raise NmtError(
                    f"{self.root} holds a stopped translation ({count:,} block(s) written): "
                    f"pass --resume to continue it, or remove {self.root}"
                )
            if count and _read_json(job) != self.job:
                raise NmtError(
                    f"{self.root} holds a stopped translation of other inputs, models or "
                    f"settings ({job}); --resume continues only the same job: remove "
                    f"{self.root} to start again"
                )
            return count > 0
        others = [p.name for p in self.root.iterdir() if p.name != LOCK]
        if others:
            raise NmtError(
                f"{self.option} {self.root}: not empty ({others[0]}, ...) and not a "
                "stopped translation; choose an empty or new directory"
            )
        return False

    def done(self) -> dict[int, BlockRecord]:
        """The blocks already written: in the journal, with their part at its size."""
        records: dict[int, BlockRecord] = {}
        journal = self.root / JOURNAL
        if self.finished:
            manifest = _read_json(self.root / MANIFEST)
            described = [{k: v for k, v in r.items() if k != "file"} for r in manifest["parts"]]
            return {r["block"]: BlockRecord(**r) for r in described}
        if not journal.exists():
            return records
        for line in journal.read_text(encoding="utf-8").splitlines():
            try:
                record = BlockRecord(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a line torn by a kill: its block is translated again
            part = self.part(record.block)
            if part.is_file() and part.stat().st_size == record.size:
                records[record.block] = record
        return records

    def write(self, record: BlockRecord, data: bytes) -> None:
        """The block's part, then its journal line (flushed to disk: a rerun trusts it)."""
        atomic_write_bytes(self.part(record.block), data)
        with open(self.root / JOURNAL, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dataclasses.asdict(record)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def write_manifest(self, records: list[BlockRecord], inputs: list[dict[str, Any]]) -> None:
        """Complete the directory: the manifest, written last, then the work files go."""
        manifest = {
            "format": FORMAT,
            "version": 1,
            "nmt_version": __version__,
            "job": self.job,
            "inputs": inputs,
            "lines": sum(r.lines for r in records),
            "parts": [{"file": self.part(r.block).name, **dataclasses.asdict(r)} for r in records],
        }
        atomic_write_text(self.root / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        for name in (JOURNAL, JOB):
            (self.root / name).unlink(missing_ok=True)
        self.finished = True

    def concatenate(self, records: Iterable[BlockRecord], sink: BinaryIO) -> None:
        """The parts of `records`, in their order, into `sink`."""
        for record in records:
            with open(self.part(record.block), "rb") as part:
                shutil.copyfileobj(part, sink, 1 << 20)

    def remove(self) -> None:
        shutil.rmtree(self.root)


def in_order(records: dict[int, BlockRecord], lines: int) -> list[BlockRecord]:
    """The records in input order, checked to hold every one of `lines` lines once: a gap
    or an overlap would be a wrong output, so it stops here instead."""
    ordered = [records[k] for k in sorted(records)]
    expected = 1
    for k, record in enumerate(ordered):
        if record.block != k or record.first_line != expected:
            raise NmtError(
                f"block {k} of the translation is missing or misplaced (lines from "
                f"{expected}); rerun with --resume to translate what is missing"
            )
        expected += record.lines
    if expected - 1 != lines:
        raise NmtError(f"the translation has {expected - 1:,} lines, the input {lines:,}")
    return ordered


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NmtError(f"{path}: unreadable ({exc}); remove its directory to start again") from None
    if not isinstance(value, dict):
        raise NmtError(f"{path}: not a translation's record; remove its directory")
    return value
