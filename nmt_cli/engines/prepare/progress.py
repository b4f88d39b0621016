"""What the prepare engine tells its caller as it works; the CLI draws rich bars from it.

The engine knows nothing of rich: it calls a plain function with `StageEvent`s. Each unit
of work ("clean train", "vocabulary spm.model", "binarize valid", "checksums") is one
`step`: a start event with the expected total, advances, and an end event that is sent
only when the step finished (an error or an interrupt leaves the bar where it stopped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

STAGES = ("clean", "vocab", "binarize", "manifest")


@dataclass(frozen=True)
class StageEvent:
    """What the engine tells its caller; the CLI turns these into rich progress bars."""

    stage: str  # one of STAGES
    kind: str  # "start" | "advance" | "end" | "skip"
    label: str = ""
    total: int | None = None
    advance: int = 0


Progress = Callable[[StageEvent], None]


def no_progress(event: StageEvent) -> None:
    """The callback for callers that want no progress."""


@dataclass(frozen=True)
class Step:
    """One started unit of work; `advance` reports how much more of it is done."""

    progress: Progress
    stage: str
    label: str

    def advance(self, n: int) -> None:
        self.progress(StageEvent(self.stage, "advance", self.label, advance=n))


@contextmanager
def step(progress: Progress, stage: str, label: str, total: int | None = None) -> Iterator[Step]:
    """Announce a unit of work, yield it for advances, and announce its end if it ends well."""
    progress(StageEvent(stage, "start", label, total))
    yield Step(progress, stage, label)
    progress(StageEvent(stage, "end", label))
