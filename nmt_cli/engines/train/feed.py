"""The training data as a sequence of updates: epoch plans, micro-batches, dropout seeds.

Section 5.1: batches of about 25,000 source and 25,000 target tokens. The recipe's
effective batch (`train.batch_tokens`) is split over devices and accumulation steps
(`derive_split`), so the same recipe trains the same model on 1 CPU, 1 GPU or 8 GPUs.
The data order is a pure function of (seed, epoch), so the feed resumes from a saved
(epoch, batches done) position without replaying anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from nmt_cli.config import TrainConfig
from nmt_cli.core.batching import Batch, EpochPlan, collate, plan_epoch, real_token_fraction
from nmt_cli.core.data import TokenStore
from nmt_cli.core.flops import train_flops
from nmt_cli.core.transformer import ModelConfig
from nmt_cli.engines.train.checkpoints import Position
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.events import BatchSplit
from nmt_cli.errors import NmtError


def derive_split(
    train: TrainConfig,
    world: int,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    multiple: int = 1,
) -> BatchSplit:
    """Per-device padded max_tokens and accumulation so that an update holds about
    `train.batch_tokens` real tokens on its larger side, whatever the number of devices.

    Batches are cut by padded size (what bounds memory); the padded budget of an update is
    the real one divided by the fraction of padded slots that real tokens fill on this
    data at the size of one pass. With `train.max_tokens` set, the fraction is measured at
    that cap, so the split depends on the number of devices only through the division
    below (2 devices x 1 pass cut the same batches as 1 device x 2 passes); otherwise at
    the per-device share itself (measured twice, as the share depends on it). Widths
    padded to a `multiple` (GPUs) count as padding.
    """
    share = math.ceil(train.batch_tokens / world)  # real tokens per device and update
    per_pass = train.max_tokens or share
    for _ in range(1 if train.max_tokens else 2):
        fraction = real_token_fraction(src_lengths, tgt_lengths, per_pass, multiple)
        padded = math.ceil(share / fraction)
        per_pass = train.max_tokens or padded
    accum = max(1, math.ceil(padded / per_pass))
    return BatchSplit(train.batch_tokens, world, accum, math.ceil(padded / accum), fraction)


MicroBatches = list[tuple[Batch, float]]  # (batch, weight) for each pass of an update


class TrainFeed:
    """This rank's view of the training split, update after update.

    With `background`, each call of `micro_batches` starts collating the next update's
    batches in a worker thread, which runs while this update computes (the matrix
    products release the GIL): the training thread then only takes them, instead of
    spending milliseconds of Python on padding (host time a GPU waits for). `prefetch`
    also starts their copy to the device ahead of time; `micro_batches` then hands them
    out instead of building them again.

    The loop asks for `background` only where it prefetches (GPUs): on a CPU the training
    thread collates itself, a millisecond an update. A second thread running torch's
    operations gets an OpenMP thread pool of its own, and once a process has more OpenMP
    threads than cores libgomp's threads stop spinning at barriers and sleep at once, so
    every short operation of a two-thread update pays a wake-up, and every part of the
    update is slower with the worker thread than without (BENCHMARKS.md, "The training
    loop around the update").
    """

    def __init__(
        self,
        src: TokenStore,
        tgt: TokenStore,
        split: BatchSplit,
        seed: int,
        ctx: DistContext,
        max_epochs: int,
        name: str,
        multiple: int = 1,
        background: bool = False,
    ) -> None:
        self.src, self.tgt, self.name = src, tgt, name
        self.split, self.seed, self.max_epochs = split, seed, max_epochs
        self.rank, self.device = ctx.rank, ctx.device
        self.multiple = multiple
        self._ahead: tuple[EpochPlan, int, MicroBatches] | None = None  # on the device
        self._worker = (
            ThreadPoolExecutor(1, thread_name_prefix="nmt-batches") if background else None
        )
        self._collating: tuple[EpochPlan, int, Future[MicroBatches]] | None = None
        self._planned: tuple[int, EpochPlan] | None = None

    def plan(self, epoch: int) -> EpochPlan:
        """The epoch's plan, computed once: the loop and `updates` both ask for it, and on
        a large corpus planning an epoch takes seconds."""
        if self._planned is None or self._planned[0] != epoch:
            self._planned = (epoch, self._plan(epoch))
        return self._planned[1]

    def _plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(
            self.src.lengths,
            self.tgt.lengths,
            self.split.max_tokens,
            self.seed,
            epoch,
            self.split.world,
            self.split.accum,
            multiple=self.multiple,
        )

    def updates(self, pos: Position) -> Iterator[tuple[EpochPlan, int]]:
        """(plan, update index) from `pos` on, epoch after epoch; advances `pos.epoch` and
        resets `pos.batches_done` at each epoch's end (the caller advances batches_done)."""
        while True:
            if self.max_epochs and pos.epoch >= self.max_epochs:
                return
            plan = self.plan(pos.epoch)
            if plan.updates == 0:
                raise NmtError(f"{self.name}: the training split is empty")
            first = -(-pos.batches_done // plan.slots)
            for update in range(first, plan.updates):
                yield plan, update
            pos.epoch += 1
            pos.batches_done = 0

    def micro_batches(self, plan: EpochPlan, update: int) -> MicroBatches:
        """(batch on this rank's device, weight) for each of this rank's slots; an empty
        slot of the last update runs the update's first batch with weight 0 (every rank
        must run as many passes)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is plan and ahead[1] == update:
            out = ahead[2]
        else:
            out = [(b.to(self.device), w) for b, w in self._host_batches(plan, update)]
        if self._worker is not None and update + 1 < plan.updates:
            next_batches = self._worker.submit(self._collate, plan, update + 1)
            self._collating = (plan, update + 1, next_batches)
        return out

    def _host_batches(self, plan: EpochPlan, update: int) -> MicroBatches:
        """The update's batches in host memory: the worker's, when it prepared these."""
        collating, self._collating = self._collating, None
        if collating is not None and collating[0] is plan and collating[1] == update:
            return collating[2].result()  # a collation error surfaces here
        return self._collate(plan, update)

    def _collate(self, plan: EpochPlan, update: int) -> MicroBatches:
        stand_in = update * plan.slots  # the update's first batch always exists
        out = []
        for slot in plan.rank_slots(update, self.rank):
            index = stand_in if slot is None else slot
            batch = collate(self.src, self.tgt, plan.batches[index], self.multiple)
            out.append((batch, 0.0 if slot is None else 1.0))
        return out

    def close(self) -> None:
        """Stop the worker thread (what it is collating is dropped)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
            self._worker = None

    def prefetch(self, plan: EpochPlan, update: int) -> None:
        """Prepare `update` of `plan` now (within the epoch; past its end, nothing)."""
        if update < plan.updates:
            host = self._host_batches(plan, update)
            self._ahead = (plan, update, [(b.to(self.device), w) for b, w in host])

    def update_flops(self, plan: EpochPlan, update: int, cfg: ModelConfig) -> float:
        """Training FLOPs of the whole update over all ranks, on the padded shapes."""
        lo = update * plan.slots
        total = 0.0
        for b in plan.batches[lo : lo + plan.slots]:
            src_len = int(self.src.lengths[b].max()) + 1
            tgt_len = int(self.tgt.lengths[b].max()) + 1
            total += train_flops(cfg, len(b), src_len, tgt_len)
        return total

    def micro_seeds(self, attempt: int) -> list[int]:
        """Dropout seeds of this rank's micro-batches, from their global slot in the update:
        one process accumulating two batches draws the same masks as two ranks."""
        first = self.seed * 2**40 + attempt * 2**20 + self.rank * self.split.accum
        return [first + i for i in range(self.split.accum)]
