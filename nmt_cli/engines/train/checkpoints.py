"""What a training run writes to and restores from `checkpoints/` (see `run_dir.py`).

    step_XXXXXXXX.pt  inference checkpoint (weights, vocabulary, dev figures in `meta`);
                      the newest `keep_last` are kept, for averaging (section 6.1)
    best.pt           a copy of the step checkpoint with the lowest dev loss so far
    last.pt           the training checkpoint: weights plus `train_state` (optimizer,
                      scaler, RNG, data position, clock), what a rerun resumes from

`last.pt` is written after every step checkpoint and on every stop, so a rerun always
continues from the newest state, and an interrupted run resumed from it ends with the
same weights as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt_cli.core.averaging import differences
from nmt_cli.core.checkpoint import Checkpoint, save_checkpoint
from nmt_cli.core.transformer import ModelConfig
from nmt_cli.core.vocab import VocabPair
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.engines.train.validate import DevFigures
from nmt_cli.errors import NmtError


@dataclass
class Position:
    """Where training stands: everything besides weights and optimizer that resuming needs."""

    epoch: int = 0
    batches_done: int = 0  # batches of this epoch consumed (all ranks)
    step: int = 0
    elapsed_s: float = 0.0  # training time of the run, summed over every process
    skipped: int = 0  # non-finite updates skipped
    best_dev_loss: float | None = None
    train_flops: float = 0.0  # counted: matrix products of every update (core/flops.py)
    device_flops: float = 0.0  # the paper's Table 2 way: time x devices x sustained rate

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Position:
        return cls(
            epoch=int(state["epoch"]),
            batches_done=int(state["batches_done"]),
            step=int(state["step"]),
            elapsed_s=float(state["elapsed_s"]),
            skipped=int(state.get("skipped", 0)),
            best_dev_loss=state.get("best_dev_loss"),
            train_flops=float(state.get("train_flops", 0.0)),
            device_flops=float(state.get("device_flops", 0.0)),
        )


def check_resumable(ckpt: Checkpoint, cfg: ModelConfig, vocab: VocabPair, path: Path) -> None:
    """Refuse to resume into a different model or vocabulary, naming what changed."""
    changes = differences(
        dataclasses.asdict(ckpt.model_config), dataclasses.asdict(cfg), prefix="model."
    )
    if ckpt.vocab.src.model_proto != vocab.src.model_proto:
        changes.append("the source vocabulary (SentencePiece model) differs from the data's")
    if not vocab.joint and ckpt.vocab.tgt.model_proto != vocab.tgt.model_proto:
        changes.append("the target vocabulary (SentencePiece model) differs from the data's")
    if changes:
        raise NmtError(
            f"{path}: cannot resume, the run was trained with a different setup "
            "(checkpoint vs now): " + "; ".join(changes) + ". Restore the recipe and data, "
            "or train into a new --run-dir"
        )
    if ckpt.kind != "train" or ckpt.train_state is None:
        raise NmtError(f"{path}: not a training checkpoint (kind {ckpt.kind!r}); cannot resume")


class CheckpointKeeper:
    """Writes step, best and last checkpoints of one run and restores training state."""

    def __init__(
        self,
        run: RunDir,
        model_config: ModelConfig,
        vocab: VocabPair,
        recipe: dict[str, Any],
        keep_last: int,
        origin: dict[str, Any] | None = None,
    ) -> None:
        self.run = run
        self.model_config, self.vocab, self.recipe = model_config, vocab, recipe
        self.origin = origin  # where the starting weights came from (fine-tuning)
        self.keep_last = keep_last
        existing = run.step_checkpoints()
        self.newest_step_file: Path | None = existing[-1] if existing else None

    def _checkpoint(self, weights: dict[str, torch.Tensor], step: int) -> Checkpoint:
        return Checkpoint(
            model_config=self.model_config,
            vocab=self.vocab,
            model=weights,
            step=step,
            recipe=self.recipe,
            origin=self.origin,
        )

    def save_step(
        self,
        weights: dict[str, torch.Tensor],
        pos: Position,
        figures: DevFigures | None,
    ) -> tuple[Path, bool]:
        """Write step_N.pt with its dev figures; copy it to best.pt when its dev loss is the
        lowest so far (updating `pos.best_dev_loss`); rotate. Returns (path, is_best)."""
        meta: dict[str, Any] = {"epoch": pos.epoch, "elapsed_s": pos.elapsed_s}
        best = False
        if figures is not None:
            meta.update(dev_loss=figures.loss, dev_nll=figures.nll, dev_ppl=figures.ppl)
            if figures.bleu is not None:
                meta["dev_bleu"] = figures.bleu
            best = pos.best_dev_loss is None or figures.loss < pos.best_dev_loss
            if best:
                pos.best_dev_loss = figures.loss
        ckpt = dataclasses.replace(self._checkpoint(weights, pos.step), meta=meta)
        path = save_checkpoint(ckpt, self.run.step_path(pos.step))
        self.newest_step_file = path
        if best:
            self.run.copy_to_best(path)
        self.run.rotate(self.keep_last)
        return path, best

    def save_last(self, weights: dict[str, torch.Tensor], train_state: dict[str, Any]) -> None:
        ckpt = dataclasses.replace(
            self._checkpoint(weights, int(train_state["step"])),
            kind="train",
            train_state=train_state,
        )
        save_checkpoint(ckpt, self.run.last)

    def has_step(self, step: int) -> bool:
        return self.run.step_path(step).is_file()


def train_state(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    pos: Position,
    seed: int,
    split: dict[str, Any],
) -> dict[str, Any]:
    """The `train_state` of last.pt: what resuming restores besides the weights."""
    return {
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        **dataclasses.asdict(pos),
        "rng_torch": torch.get_rng_state(),
        "seed": seed,
        "split": split,
    }


def restore_train_state(
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
) -> Position:
    """Load optimizer, scaler and RNG from `state`; return the saved position."""
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if "rng_torch" in state:
        torch.set_rng_state(state["rng_torch"])
    return Position.from_state(state)
