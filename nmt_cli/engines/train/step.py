"""One optimizer update: forward/backward over this rank's micro-batches, then Adam.

The loss of every micro-batch is divided by the target tokens of the *whole* update (all
accumulation steps on all ranks, known from the epoch plan without communication) and
multiplied by the world size, because DDP averages gradients over ranks. So accumulation
and DDP produce the gradient of one large batch's per-token loss, and the effective batch
is the same on 1 CPU, 1 GPU or 8 GPUs.

One host sync per update: the gradient norm (which decides whether the update is finite)
and the loss sums come back together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nmt_cli.core.batching import Batch
from nmt_cli.core.losses import label_smoothed_sums
from nmt_cli.core.precision import autocast
from nmt_cli.core.schedule import set_learning_rate
from nmt_cli.errors import NmtError


@dataclass
class UpdateStats:
    loss_sum: float  # smoothed loss summed over this rank's target tokens
    nll_sum: float
    tokens: int  # this rank's real target tokens
    grad_norm: float  # before clipping; inf/nan when the update was skipped
    skipped: bool


class OutOfMemory(NmtError):
    """A batch did not fit; the message says which and what to lower."""


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


class Updater:
    """Runs updates for one rank; `model` may be DDP-wrapped."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: str,
        device: torch.device,
        label_smoothing: float,
        pad_id: int,
        clip_norm: float,
        world: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.precision = precision
        self.device = device
        self.eps = label_smoothing
        self.pad_id = pad_id
        self.clip_norm = clip_norm
        self.world = world
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.params = [p for p in model.parameters() if p.requires_grad]

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        if not last and isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def update(
        self,
        micro: list[tuple[Batch, float]],
        update_tokens: int,
        lr: float,
        seeds: list[int],
    ) -> UpdateStats:
        """micro: (batch, weight) pairs, weight 0 for an empty slot's stand-in batch;
        seeds: one dropout seed per micro-batch."""
        self.model.train()
        scale = self.world / max(update_tokens, 1)
        loss_acc = torch.zeros((), device=self.device)
        nll_acc = torch.zeros((), device=self.device)
        tokens = 0
        for i, (batch, weight) in enumerate(micro):
            # Dropout masks from a seed per (update, rank, micro-batch): resuming, or
            # changing nothing but the run's interruptions, reproduces them exactly.
            torch.manual_seed(seeds[i])
            with self._no_sync(i == len(micro) - 1), _oom_guard(batch):
                with autocast(self.precision, self.device):
                    logits = self.model(batch.src, batch.tgt_in)
                    loss, nll = label_smoothed_sums(logits, batch.tgt_out, self.eps, self.pad_id)
                del logits
                scaled = loss * (scale * weight)
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            loss_acc += loss.detach() * weight
            nll_acc += nll.detach() * weight
            tokens += batch.tgt_tokens if weight else 0
        return self._step(loss_acc, nll_acc, tokens, lr)

    def _step(
        self, loss_acc: torch.Tensor, nll_acc: torch.Tensor, tokens: int, lr: float
    ) -> UpdateStats:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        loss_sum, nll_sum, grad_norm = torch.stack(
            [loss_acc.float(), nll_acc.float(), norm.float()]
        ).tolist()
        finite = math.isfinite(grad_norm)
        if finite and self.clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip_norm, norm, foreach=True)
        set_learning_rate(self.optimizer, lr)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips by itself when inf/nan was found
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return UpdateStats(loss_sum, nll_sum, tokens, grad_norm, skipped=not finite)


@contextlib.contextmanager
def _oom_guard(batch: Batch) -> Iterator[None]:
    try:
        yield
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        if not _is_oom(exc):
            raise
        raise OutOfMemory(
            f"out of memory on a batch of {batch.sentences} sentences x "
            f"{batch.src.size(1)} source / {batch.tgt_in.size(1)} target tokens; lower "
            "train.max_tokens (gradient accumulation keeps the effective batch "
            "train.batch_tokens) or data.max_len"
        ) from None
