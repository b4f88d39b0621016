"""Reading a run's metrics.jsonl back as series to draw.

`nmt train` appends one JSON object per log interval (`"type": "train"`: loss, lr,
grad_norm, tokens_per_s, ...) and one per validation (`"type": "valid"`: dev_loss, dev_ppl,
dev_bleu, ...), each with its step and the training time so far (`elapsed_s`). A run that
is still training may end with a partial line; that line is skipped, not an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError

METRICS = "metrics.jsonl"


@dataclass(frozen=True)
class Series:
    """One figure of one run: its values against steps and against training time."""

    steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.values)


@dataclass(frozen=True)
class RunLog:
    name: str
    records: list[dict[str, Any]]

    def series(self, kind: str, key: str) -> Series:
        """`key` of the records of `kind` ("train" or "valid") that have it."""
        out = Series()
        for r in self.records:
            value = r.get(key)
            if r.get("type") == kind and isinstance(value, int | float):
                out.steps.append(int(r.get("step", 0)))
                out.seconds.append(float(r.get("elapsed_s", 0.0)))
                out.values.append(float(value))
        return out


def read_run_log(run_dir: str | Path, name: str | None = None) -> RunLog:
    """The metrics of the run in `run_dir` (named after the directory unless `name`)."""
    root = Path(run_dir)
    path = root / METRICS
    if not path.is_file():
        what = "no run directory" if not root.is_dir() else f"no {METRICS} in it"
        raise NmtError(f"{root}: {what}; give the directory `nmt train` wrote (train.run_dir)")
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return RunLog(name or root.resolve().name, records)
