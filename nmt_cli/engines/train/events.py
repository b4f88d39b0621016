"""What the training engine reports while it runs, as plain data.

The engine calls `on_event(event)` on rank 0 only; the command layer turns these into a
rich display, and `nmt run` or a test can consume them without any terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BatchSplit:
    """How the recipe's effective batch is spread over devices and accumulation steps."""

    batch_tokens: int  # effective batch: real tokens of the larger side per update
    world: int  # processes (devices)
    accum: int  # forward/backward passes per process per update
    max_tokens: int  # padded tokens (sentences x longest side) per forward pass per process
    real_fraction: float = 1.0  # real tokens (larger side) per padded token on this data

    def describe(self) -> str:
        return (
            f"about {self.batch_tokens:,} real tokens per update = {self.world} device(s) x "
            f"{self.accum} accumulation step(s) x {self.max_tokens:,} padded tokens "
            f"({self.real_fraction:.0%} real)"
        )


@dataclass(frozen=True)
class TrainStarted:
    run_dir: Path
    device: str  # e.g. "cpu x 2 processes (gloo)", "cuda x 8 (nccl)"
    precision: str  # resolved: fp32, bf16 or fp16
    split: BatchSplit
    parameters: int
    train_pairs: int
    dev_pairs: int
    updates_per_epoch: int
    start_step: int  # 0 for a fresh run
    max_steps: int  # 0 = no limit
    threads: int
    first_updates: list[tuple[int, int]]  # real (source, target) tokens of the next updates


@dataclass(frozen=True)
class StepDone:
    """After every optimizer update (or skipped update)."""

    step: int
    epoch: int
    loss: float  # label-smoothed loss per target token of this update (rank 0's share)
    nll: float  # per target token; perplexity = exp(nll)
    lr: float
    grad_norm: float
    tokens_per_s: float  # target tokens per second over all ranks, recent average
    elapsed_s: float  # total training time of the run, across resumes
    remaining_s: float | None  # estimate to max_steps / max_time; None if unbounded
    skipped: int  # non-finite updates skipped so far


@dataclass(frozen=True)
class CheckpointSaved:
    step: int
    path: Path | None  # the step checkpoint (None when only last.pt was written)
    dev_loss: float | None
    dev_ppl: float | None
    dev_bleu: float | None
    best: bool
    elapsed_s: float


@dataclass(frozen=True)
class Notice:
    """Something a person should read: a warning, a skipped step, why training stopped."""

    text: str
    warning: bool = False
    detail: bool = False  # shown with --verbose only (always in train.log)


TrainEvent = TrainStarted | StepDone | CheckpointSaved | Notice
