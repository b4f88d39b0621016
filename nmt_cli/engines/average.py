"""`nmt average-checkpoints`: the paper's final model is the mean of the last checkpoints
(5 for base, 20 for big, written 10 minutes apart).

Checkpoints are loaded one at a time and added to a float64 running sum, so 20 big
checkpoints need the memory of two. Every checkpoint must have the first one's model
configuration and vocabularies; the first difference is named. The result is an
inference checkpoint (weights, configuration, vocabularies, no optimizer state) that
`nmt translate` loads, and its meta records what was averaged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.core.averaging import AveragingError, StateAverager, first_difference
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from nmt_cli.errors import NmtError

STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


@dataclass(frozen=True)
class AverageResult:
    output: Path
    inputs: list[Path]
    steps: list[int]  # training step of each input, in the order averaged
    parameters: int  # number of values averaged


def step_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """The step checkpoints of a run directory, oldest first, by the step in the name.

    Accepts the run directory or its `checkpoints/` folder; last.pt and best.pt are not
    step checkpoints and are never selected.
    """
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    if not folder.is_dir():
        raise NmtError(f"{run_dir}: no such run directory")
    found = []
    for path in folder.iterdir():
        match = STEP_FILE.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def select_last(run_dir: Path, n: int) -> list[Path]:
    """The newest `n` step checkpoints of a run (all of them if it has fewer)."""
    if n < 1:
        raise NmtError(f"--last must be at least 1, got {n}")
    found = step_checkpoints(run_dir)
    if not found:
        raise NmtError(
            f"{run_dir}: no step checkpoints (checkpoints/step_XXXXXXXX.pt) to average; "
            "has training saved any yet?"
        )
    return [path for _, path in found[-n:]]


def _compatibility(first: Checkpoint, other: Checkpoint, a: Path, b: Path) -> None:
    diff = first_difference(
        dataclasses.asdict(first.model_config), dataclasses.asdict(other.model_config)
    )
    if diff is not None:
        raise NmtError(
            f"cannot average {b} with {a}: different architectures (model.{diff}; "
            f"values of {a.name} first)"
        )
    for side in ("src", "tgt"):
        if getattr(first.vocab, side).model_proto != getattr(other.vocab, side).model_proto:
            raise NmtError(
                f"cannot average {b} with {a}: different {side} vocabularies "
                "(the SentencePiece models differ; checkpoints of one run share them)"
            )


def average_checkpoints(paths: list[Path], output: Path) -> AverageResult:
    """Average `paths` (any order; at least one) into an inference checkpoint at `output`."""
    if not paths:
        raise NmtError("no checkpoints to average")
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise NmtError(f"{dup} is given twice; each checkpoint may be averaged once")
    averager = StateAverager(integers="last")
    first: Checkpoint | None = None
    steps: list[int] = []
    recipe = None
    for path in paths:
        ckpt = load_checkpoint(path)
        if first is None:
            first = ckpt
        else:
            _compatibility(first, ckpt, paths[0], path)
        try:
            averager.add(ckpt.model)
        except AveragingError as exc:
            raise NmtError(f"cannot average {path} with {paths[0]}: {exc}") from None
        steps.append(ckpt.step)
        recipe = ckpt.recipe
        # Drop the weights now: only the running sum stays while the next one loads.
        ckpt.model = {}
    assert first is not None
    weights = averager.result()
    averaged = Checkpoint(
        model_config=first.model_config,
        vocab=first.vocab,
        model=weights,
        step=max(steps),
        kind="inference",
        recipe=recipe,
        meta={
            "averaged_from": [p.name for p in paths],
            "averaged_steps": steps,
            "averaged_count": len(paths),
        },
    )
    save_checkpoint(averaged, output)
    return AverageResult(
        output=output,
        inputs=list(paths),
        steps=steps,
        parameters=sum(t.numel() for t in weights.values()),
    )
