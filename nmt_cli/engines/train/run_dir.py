"""The run directory that `nmt train` writes, and the lock that keeps it to one trainer.

    config.json                   the resolved recipe this run was started (or resumed) with,
                                  its [data] as the data directory has it
    data.json                     the data directory's languages, vocabulary, counts and
                                  checksums (see data_record.py)
    train.log                     what the run said, one time-stamped line each
    spm.model                     the vocabulary (spm.src.model + spm.tgt.model when separate)
    checkpoints/step_XXXXXXXX.pt  inference checkpoints; the last `keep_last` are kept for
                                  averaging (the paper averages the last 5 or 20)
    checkpoints/last.pt           the training state: weights, optimizer, schedule, data
                                  position; what a rerun resumes from
    checkpoints/best.pt           the checkpoint with the lowest dev loss so far
    metrics.jsonl                 one JSON object per log interval and per validation
    train.lock                    pid and host of the live trainer

Every file is written atomically (temporary file, then rename), so a kill at any moment
leaves each file either as it was or complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from nmt_cli.core.files import atomic_path, atomic_write_bytes, atomic_write_text
from nmt_cli.core.vocab import VocabPair
from nmt_cli.dir_lock import DirLock, DirLocked

_STEP_FILE = re.compile(r"^step_(\d{8,})\.pt$")


RunDirLocked = DirLocked  # another live `nmt train` is using the run directory


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def lock_file(self) -> Path:
        return self.root / "train.lock"

    def step_path(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:08d}.pt"

    def step_checkpoints(self) -> list[Path]:
        """Step checkpoints, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.checkpoints.iterdir()
            if (m := _STEP_FILE.match(p.name))
        ]
        return [p for _, p in sorted(found)]

    def rotate(self, keep_last: int) -> list[Path]:
        """Delete all but the newest `keep_last` step checkpoints; return what was deleted."""
        old = self.step_checkpoints()[:-keep_last]
        for path in old:
            path.unlink(missing_ok=True)
        return old

    def remove_partial_writes(self) -> list[Path]:
        """Delete temporary files that a killed writer left behind (never a finished file:
        those are renamed into place only once complete)."""
        removed = []
        for folder in (self.root, self.checkpoints):
            if folder.is_dir():
                for path in folder.glob(".*.tmp"):
                    path.unlink(missing_ok=True)
                    removed.append(path)
        return removed

    def copy_to_best(self, source: Path) -> None:
        with atomic_path(self.best) as tmp:
            shutil.copyfile(source, tmp)

    def write_config(self, recipe: dict[str, Any]) -> None:
        atomic_write_text(self.root / "config.json", json.dumps(recipe, indent=2) + "\n")

    @property
    def data_record(self) -> Path:
        return self.root / "data.json"

    def write_data_record(self, record: dict[str, Any]) -> None:
        atomic_write_text(self.data_record, json.dumps(record, indent=2) + "\n")

    @property
    def log_file(self) -> Path:
        return self.root / "train.log"

    def log(self, text: str) -> None:
        """One time-stamped line in train.log, appended in one write (like metrics)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._append(self.log_file, f"{stamp}  {text}\n")

    def write_vocab(self, vocab: VocabPair) -> None:
        if vocab.joint:
            atomic_write_bytes(self.root / "spm.model", vocab.src.model_proto)
        else:
            atomic_write_bytes(self.root / "spm.src.model", vocab.src.model_proto)
            atomic_write_bytes(self.root / "spm.tgt.model", vocab.tgt.model_proto)

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics, json.dumps(record) + "\n")

    def _append(self, path: Path, line: str) -> None:
        """One line, written with a single append so a kill never interleaves records."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    def truncate_metrics(self, after_step: int) -> None:
        """On resume, drop records logged after the checkpoint (their work is redone) and
        any partial last line a kill left behind."""
        if not self.metrics.is_file():
            return
        text = self.metrics.read_text(encoding="utf-8")
        kept: list[str] = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(record.get("step", 0)) <= after_step:
                kept.append(line)
        wanted = "".join(f"{line}\n" for line in kept)
        if wanted != text:  # untouched otherwise: what is drawn from it stays up to date
            atomic_write_text(self.metrics, wanted)

    # -- lock -----------------------------------------------------------------------------

    def _lock(self) -> DirLock:
        return DirLock(self.lock_file, "nmt train", "--run-dir")

    def acquire_lock(self) -> None:
        """Take the run directory's lock (see nmt_cli/dir_lock.py)."""
        self._lock().acquire()

    def release_lock(self) -> None:
        self._lock().release()
