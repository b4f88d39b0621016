"""How a CPU run uses the cores: one process of N threads, or N processes of one thread.

N threads in one process split every operation of an update between the cores. The large
matrix products scale, but a small model's many short operations (layer norms, softmaxes,
dropout, the loss's chunks) each pay a fork and a barrier of the thread pool, and barely
get faster. N processes (DDP over gloo, `--procs N`) each run the whole forward and
backward of 1/N of the batch on one thread, and pay one all-reduce of the gradients per
update instead. Which is faster depends on the model, the batch and the machine, so when
`--procs` is not given `nmt train` measures both before it starts: one real batch's
forward and backward with N threads, and the same batch cut in N parts run side by side
by N Python threads of one compute thread each, which stand in for the N processes (the
operations release the GIL; each part has its own copy of the model). The processes are
taken only when they are faster by `margin`, which covers what the stand-in leaves out:
the all-reduce, a second interpreter and the spawn: the stand-in rates the processes
well above what real training gets from them (BENCHMARKS.md, "The training loop around
the update"), hence 1.25.

A short run never probes (spawning processes costs seconds), and a resumed run keeps the
layout it started with, so resuming stays exact.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from nmt_cli.backends.cpu.training import training_kernel
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.config import TrainConfig
from nmt_cli.core.batching import Batch, collate, plan_epoch
from nmt_cli.core.data import TokenStore
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.precision import autocast, resolve_precision
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import PAD_ID
from nmt_cli.engines.train.feed import derive_split
from nmt_cli.engines.train.plan import TrainPlan
from nmt_cli.heap import reused_heap
from nmt_cli.interrupts import startup_phase

# Below this many seconds of expected training, one process is kept without a probe.
SHORT_RUN_S = 120.0


@dataclass(frozen=True)
class CpuLayout:
    procs: int
    threads: int  # compute threads of each process
    reason: str  # what `nmt train` says about the choice at start

    def describe(self) -> str:
        if self.procs == 1:
            return f"one process of {self.threads} thread(s)"
        return f"{self.procs} processes (DDP over gloo) of {self.threads} thread each"


def _forward_backward(objective: TrainingObjective, batch: Batch, precision: str) -> None:
    with autocast(precision, torch.device("cpu")):
        loss, _ = objective(batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_tokens)
    loss.backward()


def _best_of_two(run: Callable[[], None]) -> float:
    """The faster of two timings: the first also warms the allocator and kernels."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Probe:
    """Seconds of one batch's forward and backward in each layout on this machine (see
    the module's text); each leaves torch's thread count as it found it."""

    def __init__(
        self,
        cfg: ModelConfig,
        src: TokenStore,
        tgt: TokenStore,
        indices: np.ndarray,
        cores: int,
        precision: str,
    ) -> None:
        torch.manual_seed(0)
        kernel, no_kernel = training_kernel(build=False)  # as training's
        target = Target(torch.device("cpu"), True, kernel=kernel, no_kernel=no_kernel)
        operations = machine_plan(target).operations
        self.objective = TrainingObjective(
            Transformer(cfg, operations),
            0.1,
            PAD_ID,
            fused_projection=False,
            loss_sweep=operations.loss_sweep,
        )
        self.whole = collate(src, tgt, indices)
        self.parts = [collate(src, tgt, indices[i::cores]) for i in range(cores)]
        self.cores, self.precision = cores, precision

    def threads_s(self) -> float:
        """One process of `cores` threads on the whole batch."""
        with _threads(self.cores):
            return _best_of_two(
                lambda: _forward_backward(self.objective, self.whole, self.precision)
            )

    def processes_s(self) -> float:
        """`cores` threads of one compute thread each, a part of the batch apiece.

        Should the wait for them be interrupted (a signal), they stop at their next layer
        and nobody waits for them here: a pass can take a minute (bf16 emulated)."""
        copies = [copy.deepcopy(self.objective) for _ in range(self.cores)]
        cancel = threading.Event()
        for objective in copies:
            _stop_at_next_layer(objective, cancel)
        pool = ThreadPoolExecutor(self.cores, thread_name_prefix="nmt-probe")

        def side_by_side() -> None:
            jobs = [
                pool.submit(_forward_backward, c, p, self.precision)
                for c, p in zip(copies, self.parts, strict=True)
            ]
            for job in jobs:
                job.result()

        try:
            with _threads(1):
                seconds = _best_of_two(side_by_side)
        except BaseException:
            cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return seconds


class _Cancelled(Exception):
    """A probe's part stopped because the probe was."""


def _stop_at_next_layer(objective: TrainingObjective, cancel: threading.Event) -> None:
    """Every module of `objective` raises `_Cancelled` on entry once `cancel` is set."""

    def check(module: torch.nn.Module, args: object) -> None:
        if cancel.is_set():
            raise _Cancelled

    for module in objective.modules():
        module.register_forward_pre_hook(check)


def expected_seconds(train: TrainConfig, update_s: float) -> float:
    """How long the recipe's run would train at `update_s` a step (inf: no limit)."""
    limits = [math.inf]
    if train.max_steps:
        limits.append(train.max_steps * update_s)
    if train.max_time_minutes:
        limits.append(train.max_time_minutes * 60)
    return min(limits)


def choose_layout(
    cores: int,
    run_seconds: Callable[[float], float],
    threads_s: Callable[[], float],
    processes_s: Callable[[], float],
    margin: float = 1.25,
    rounds: int = 3,
) -> CpuLayout:
    """The layout of a fresh run on `cores` CPUs, from the probe's timings of one pass in
    each (`processes_s` is only called for a long run), the fastest of `rounds` taken in
    turn: a single pair of timings swings widely within minutes on the same machine
    (BENCHMARKS.md). `run_seconds(pass_s)` says how long the run would be at that speed:
    a short one keeps one process."""
    if cores < 2:
        return CpuLayout(1, cores, "one core")
    one_process = threads_s()
    seconds = run_seconds(one_process)
    if seconds < SHORT_RUN_S:
        return CpuLayout(1, cores, f"a short run (about {seconds:.0f} s) keeps one process")
    processes = processes_s()
    for _ in range(rounds - 1):
        one_process = min(one_process, threads_s())
        processes = min(processes, processes_s())
    speedup = one_process / processes
    measured = (
        f"measured on one batch: {cores} processes {speedup:.2f}x one process of {cores} threads"
    )
    if speedup >= margin:
        return CpuLayout(cores, 1, measured)
    return CpuLayout(1, cores, measured)


def layout_of(plan: TrainPlan, cores: int) -> CpuLayout:
    """The layout `nmt train` picks for `plan` on `cores` CPUs when --procs is not given:
    a resumed run's own, else the faster one measured on the run's first batch."""
    if plan.resumed_world is not None:
        procs = plan.resumed_world
        return CpuLayout(procs, max(1, cores // procs), "the layout the run began with")
    tc = plan.recipe.train
    if tc.threads:
        return CpuLayout(1, tc.threads, "train.threads is set")
    src, tgt = plan.data.split("train")
    split = derive_split(tc, 1, src.lengths, tgt.lengths)
    batches = plan_epoch(src.lengths, tgt.lengths, split.max_tokens, tc.seed, 0).batches
    if not batches:  # the trainer says what is wrong with the data
        return CpuLayout(1, cores, "no training batches")
    precision = resolve_precision(tc.precision, torch.device("cpu"), "train.precision")
    startup_phase(f"measuring the CPU layout ({cores} threads or {cores} processes)")
    probe = Probe(plan.model_config, src, tgt, batches[0], cores, precision)
    with reused_heap():  # the heap training runs with: glibc's own makes the timings vary more
        return choose_layout(
            cores,
            lambda pass_s: expected_seconds(tc, pass_s * split.accum),
            probe.threads_s,
            probe.processes_s,
        )
