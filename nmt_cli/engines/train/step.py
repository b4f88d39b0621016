"""One optimizer update: forward/backward over this rank's micro-batches, then Adam.

The loss of every micro-batch is divided by the target tokens of the *whole* update (all
accumulation steps on all ranks, known from the epoch plan without communication) and
multiplied by the world size, because DDP averages gradients over ranks. So accumulation
and DDP produce the gradient of one large batch's per-token loss, and the effective batch
is the same on 1 CPU, 1 GPU or 8 GPUs.

One host sync per update, at its very end: the loss sums and the gradient norm come back
together. Everything before it is queued without waiting: the norm, clipping, and, with a
fused Adam, the decision to skip a non-finite update, which the optimizer takes on the
device (the `found_inf` flag a gradient scaler hands it). `launch` queues an update and
`PendingUpdate.result` waits for it, so a GPU's trainer can prepare the next batches in
between while the device works.

A compiled objective compiles during its first update's passes. If the compiler fails
there (no Triton, no C compiler, an operation it cannot lower), the passes run again
eagerly before the optimizer has stepped, so the update is the eager one exactly, and
`compile_failure` keeps the cause for the trainer to report.
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
from nmt_cli.core.dropout import seed_dropout
from nmt_cli.core.objective import TrainingObjective
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


class PendingUpdate:
    """An update queued on the device; `result()` waits for it (the one host sync)."""

    def __init__(self, totals: torch.Tensor, tokens: int, host: list[float] | None) -> None:
        self._totals = totals  # (loss sum, nll sum, gradient norm) on the device
        self._tokens = tokens
        self._host = host  # already read back when the step needed it early

    def result(self) -> UpdateStats:
        loss_sum, nll_sum, grad_norm = self._host or self._totals.tolist()
        finite = math.isfinite(grad_norm)
        return UpdateStats(loss_sum, nll_sum, self._tokens, grad_norm, skipped=not finite)


class Updater:
    """Runs updates for one rank; `objective` (a `TrainingObjective`, maybe DDP-wrapped)
    maps (src, tgt_in, tgt_out, real target tokens) to (loss sum, nll sum)."""

    def __init__(
        self,
        objective: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: str,
        device: torch.device,
        clip_norm: float,
        world: int,
    ) -> None:
        self.objective = objective
        self.optimizer = optimizer
        self.precision = precision
        self.device = device
        self.clip_norm = clip_norm
        self.world = world
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.params = [p for p in objective.parameters() if p.requires_grad]
        # A fused Adam skips a non-finite update on the device; others need the host.
        self.skip_on_device = bool(optimizer.defaults.get("fused"))
        inner = _objective_of(objective)
        self._first_compiled = inner is not None and inner.compiled
        self.compile_failure: Exception | None = None  # why the first update ran eagerly

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        if not last and isinstance(self.objective, DistributedDataParallel):
            return self.objective.no_sync()
        return contextlib.nullcontext()

    def update(
        self,
        micro: list[tuple[Batch, float]],
        update_tokens: int,
        lr: float,
        seeds: list[int],
    ) -> UpdateStats:
        """One update, waited for: `launch(...).result()`."""
        return self.launch(micro, update_tokens, lr, seeds).result()

    def launch(
        self,
        micro: list[tuple[Batch, float]],
        update_tokens: int,
        lr: float,
        seeds: list[int],
    ) -> PendingUpdate:
        """Queue one update. micro: (batch, weight) pairs, weight 0 for an empty slot's
        stand-in batch; seeds: one dropout seed per micro-batch."""
        # Module.train() walks every submodule (host time a GPU waits for: BENCHMARKS.md):
        # only after something left the model in eval mode.
        inner = _objective_of(self.objective)
        if not (self.objective.training and (inner is None or inner.model.training)):
            self.objective.train()
        if self._first_compiled:
            sums = self._first_compiled_passes(micro, update_tokens, seeds)
        else:
            sums = self._passes(micro, update_tokens, seeds)
        return self._step(*sums, lr)

    def _first_compiled_passes(
        self, micro: list[tuple[Batch, float]], update_tokens: int, seeds: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`_passes` of the first compiled update, where compilation happens. Should the
        compiler fail, they run again eagerly: the optimizer has not stepped yet, the
        failed attempt's gradients are dropped and every pass reseeds its dropout."""
        self._first_compiled = False
        try:
            return self._passes(micro, update_tokens, seeds)
        except NmtError:  # out of memory: the batch's doing, not the compiler's
            raise
        except Exception as exc:
            for p in self.params:
                p.grad = None
            inner = _objective_of(self.objective)
            assert inner is not None
            inner.run_eagerly()
            sums = self._passes(micro, update_tokens, seeds)  # an error here is eager's
            self.compile_failure = exc
            return sums

    def _passes(
        self, micro: list[tuple[Batch, float]], update_tokens: int, seeds: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Forward and backward over the micro-batches: the gradients, and the summed
        (loss, nll, real target tokens)."""
        scale = self.world / max(update_tokens, 1)
        loss_acc = torch.zeros((), device=self.device)
        nll_acc = torch.zeros((), device=self.device)
        tokens = 0
        for i, (batch, weight) in enumerate(micro):
            # Dropout masks from a seed per (update, rank, micro-batch): resuming, or
            # changing nothing but the run's interruptions, reproduces them exactly.
            seed_dropout(self.device, seeds[i])
            with self._no_sync(i == len(micro) - 1), _oom_guard(batch):
                with autocast(self.precision, self.device):
                    loss, nll = self.objective(
                        batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_tokens, scale * weight
                    )
                scaled = loss * (scale * weight)
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            loss_acc += loss.detach() * weight
            nll_acc += nll.detach() * weight
            tokens += batch.tgt_tokens if weight else 0
        return loss_acc, nll_acc, tokens

    def _step(
        self, loss_acc: torch.Tensor, nll_acc: torch.Tensor, tokens: int, lr: float
    ) -> PendingUpdate:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        totals = torch.stack([loss_acc.float(), nll_acc.float(), norm.float()])
        if self.clip_norm > 0:
            # Harmless when the norm is not finite: that update is skipped below.
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip_norm, norm, foreach=True)
        set_learning_rate(self.optimizer, lr)
        host: list[float] | None = None
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips by itself when inf/nan was found
            self.scaler.update()
        elif self.skip_on_device:
            _step_unless_nonfinite(self.optimizer, norm)
        else:
            host = totals.tolist()
            if math.isfinite(host[2]):
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return PendingUpdate(totals, tokens, host)


def _objective_of(module: nn.Module) -> TrainingObjective | None:
    """The TrainingObjective, inside a DDP wrapper or not (None for another module)."""
    inner = module.module if isinstance(module, DistributedDataParallel) else module
    return inner if isinstance(inner, TrainingObjective) else None


def _step_unless_nonfinite(optimizer: torch.optim.Optimizer, norm: torch.Tensor) -> None:
    """A fused optimizer's step that leaves weights and moments untouched when the
    gradient norm is inf or nan, decided on the device: the flag is the one a gradient
    scaler gives such an optimizer (`found_inf`), its step count is rolled back too."""
    found_inf = (~torch.isfinite(norm)).to(torch.float32)
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


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
