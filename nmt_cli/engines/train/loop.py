"""`nmt train`: the paper's training procedure (section 5) on one CPU or many GPUs.

    train(recipe, options, on_event) -> TrainResult

reads the prepared data directory named by the recipe, writes the run directory (see
`run_dir.py`), and resumes from `checkpoints/last.pt` when a previous run left one. The
data directory, the model's configuration and the checkpoint to resume are read and
checked once, into a `TrainPlan` (`plan.py`) handed to every rank, and every rank runs
`_train_rank` on it; only rank 0 writes files and reports events.

The loop is assembled from parts with one job each: `TrainFeed` (which batches make
each update), `Updater` (one optimizer update), `StopPolicy` (when to save and stop),
`CheckpointKeeper` (what is written and restored) and `Reporter` (events and logs).

Reproducibility: the data order is a pure function of (seed, epoch), the dropout masks of
each micro-batch come from a seed derived from (seed, step, rank, micro-batch), and the
weights, optimizer and position are restored exactly, so an interrupted and resumed run
ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt_cli.backends.cpu.training import training_kernel
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.config import RecipeConfig
from nmt_cli.core.batching import EpochPlan
from nmt_cli.core.checkpoint import model_state
from nmt_cli.core.flops import matmul_rate
from nmt_cli.core.parameters import count_parameters
from nmt_cli.core.precision import dtype_of, resolve_precision
from nmt_cli.core.schedule import paper_adam, paper_learning_rate
from nmt_cli.core.transformer import Transformer
from nmt_cli.cpu_level import bf16_emulation_warning
from nmt_cli.cpus import usable_cpus
from nmt_cli.data_dir import PreparedData, open_data_dir
from nmt_cli.engines.train.build import check_positions, describe_device, training_objective
from nmt_cli.engines.train.checkpoints import (
    CheckpointKeeper,
    Position,
    restore_train_state,
    train_state,
)
from nmt_cli.engines.train.data_record import Reconciled, data_record, reconcile
from nmt_cli.engines.train.device_choices import announcement, choose
from nmt_cli.engines.train.distributed import (
    DistContext,
    LaunchSpec,
    check_devices,
    launch,
    under_torchrun,
)
from nmt_cli.engines.train.events import Notice, TrainStarted
from nmt_cli.engines.train.feed import TrainFeed, derive_split
from nmt_cli.engines.train.kernel_cache import widen_kernel_cache
from nmt_cli.engines.train.layout import layout_of
from nmt_cli.engines.train.plan import TrainPlan, plan_training
from nmt_cli.engines.train.report import EventSink, Reporter
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.engines.train.step import Updater, UpdateStats
from nmt_cli.engines.train.stop import StopPolicy, StopRequest, TrainingClock
from nmt_cli.engines.train.threads import ThreadTuner
from nmt_cli.engines.train.validate import DevFigures, Validator
from nmt_cli.engines.translate.attention import attention_of
from nmt_cli.errors import NmtError
from nmt_cli.heap import reused_heap
from nmt_cli.interrupts import cleanup_on_exit, startup_phase, stoppable_startup


@dataclass(frozen=True)
class TrainOptions:
    """How to run a recipe's training (the recipe says what to train)."""

    run_dir: str | None = None  # overrides train.run_dir
    gpus: int = 0  # 0 = CPU
    # CPU processes over gloo (with gpus == 0); None: one, or one per core where that
    # measures faster (layout.py)
    procs: int | None = None
    dist_timeout_s: float = 600.0  # start-up and collective timeout
    max_nonfinite: int = 20  # consecutive skipped updates before training gives up


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    steps: int
    elapsed_s: float
    last_checkpoint: Path | None  # newest step checkpoint
    best_checkpoint: Path | None
    final_dev_loss: float | None  # label-smoothed, per target token
    final_dev_ppl: float | None  # exp(dev nll)
    stopped_by: str  # max_steps, max_epochs, max_time or signal
    skipped_updates: int
    rank: int = 0  # under torchrun every rank returns; only rank 0 should report
    signal: int = 0  # with stopped_by == "signal": its number (SIGINT 2, SIGTERM 15)


def train(
    recipe: RecipeConfig,
    options: TrainOptions | None = None,
    on_event: EventSink | None = None,
) -> TrainResult:
    """Train `recipe`'s model; resumes when the run directory has a last checkpoint.

    SIGINT or SIGTERM before the first update raises `Interrupted` at once, with nothing
    to save (nmt_cli/interrupts.py); during training the run saves, then stops (stop.py)."""
    with stoppable_startup():
        return _start(recipe, options or TrainOptions(), on_event)


def _start(recipe: RecipeConfig, options: TrainOptions, on_event: EventSink | None) -> TrainResult:
    widen_kernel_cache()  # before the first matrix product: the layout probe's
    check_devices(LaunchSpec(options.gpus, options.procs or 1, options.dist_timeout_s))
    run = RunDir(options.run_dir or recipe.train.run_dir)
    if run.root.exists() and not run.root.is_dir():
        raise NmtError(f"{run.root}: exists and is not a directory; choose another --run-dir")
    # Checks that would fail identically on every rank run once, here, with one message.
    startup_phase("reading the data directory")
    data = open_data_dir(recipe.data.dir)
    reconciled = reconcile(recipe, data)
    if not _is_rank0():
        return _plan_and_launch(reconciled, data, run, options, None)
    run.acquire_lock()
    try:
        with cleanup_on_exit(run.release_lock):  # should start-up be cut short
            return _plan_and_launch(reconciled, data, run, options, on_event)
    finally:
        run.release_lock()


def _plan_and_launch(
    reconciled: Reconciled,
    data: PreparedData,
    run: RunDir,
    options: TrainOptions,
    on_event: EventSink | None,
) -> TrainResult:
    """What `train` does under the run's lock (on rank 0): `on_event` only there."""
    # Under the lock: the checkpoint read to resume is the one no other writer changes.
    plan = plan_training(reconciled.recipe, data, run)
    notices = [Notice(text, warning=True) for text in reconciled.warnings]
    if options.gpus == 0 and _is_rank0():  # said at once: the layout probe runs in it
        _warn_emulated_bf16(plan.recipe.train.precision, run, on_event)
    if options.gpus == 0:  # built once here, before the layout probe and the ranks
        startup_phase("loading the CPU kernels")
        why_not = _build_cpu_kernels(on_event)
        if why_not is not None:
            notices.append(
                Notice(
                    f"dropout masks, the loss and attention from PyTorch's operations: {why_not}"
                )
            )
    procs = options.procs
    if procs is None:
        procs = 1
        if options.gpus == 0 and not under_torchrun() and usable_cpus() > 1:
            layout = layout_of(plan, usable_cpus())
            procs = layout.procs
            notices.append(Notice(f"CPU layout: {layout.describe()} ({layout.reason})"))
    if _is_rank0():
        run.remove_partial_writes()  # safe: the lock says no other writer is alive
        for notice in notices:
            run.log(("warning: " if notice.warning else "") + notice.text)
            if on_event is not None:
                on_event(notice)
    spec = LaunchSpec(options.gpus, procs, options.dist_timeout_s)
    if spec.world > 1 and not under_torchrun():
        startup_phase(f"starting {spec.world} training processes")
    result: TrainResult = launch(spec, _train_rank, (plan, options), (on_event,))
    return result


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _warn_emulated_bf16(precision: str, run: RunDir, on_event: EventSink | None) -> None:
    """bf16 asked for on a CPU without bf16 units: say so, with the slowdown measured."""
    text = bf16_emulation_warning(precision, torch.device("cpu"), "train.precision")
    if text is not None:
        run.log("warning: " + text)
        if on_event is not None:
            on_event(Notice(text, warning=True))


def _build_cpu_kernels(on_event: EventSink | None) -> str | None:
    """Build the CPU backend's compiled module where it is not built yet (the first run
    of an installation: a minute or more), telling `on_event` how far the build, or the
    wait for another process's, has come (rank 0; the others say nothing); the reason
    it could not be built, if so."""

    def on_compile(text: str) -> None:
        if on_event is not None:
            on_event(Notice(text))

    return training_kernel(on_compile)[1] or None


class _Trainer:
    """One rank's model, optimizer and loop; rank 0 also validates, writes and reports."""

    def __init__(
        self,
        ctx: DistContext,
        plan: TrainPlan,
        run: RunDir,
        reporter: Reporter,
        max_nonfinite: int,
    ) -> None:
        recipe = plan.recipe
        self.ctx, self.recipe, self.run, self.report = ctx, recipe, run, reporter
        self.tc = tc = recipe.train
        self.max_nonfinite = max_nonfinite
        self.consecutive_bad = 0
        self.data = plan.data
        self.choices = choose(tc, ctx.device)
        multiple = self.choices.shape_multiple
        train_src, train_tgt = self.data.split("train")
        self.split = derive_split(tc, ctx.world, train_src.lengths, train_tgt.lengths, multiple)
        self.feed = TrainFeed(
            train_src,
            train_tgt,
            self.split,
            tc.seed,
            ctx,
            tc.max_epochs,
            str(self.data.root),
            multiple,
            background=self.choices.prefetch,
        )
        self.cfg = plan.model_config
        check_positions(self.cfg, train_src.lengths, train_tgt.lengths)
        self.precision = resolve_precision(tc.precision, ctx.device, "train.precision")
        resume = plan.resume.take() if plan.resume is not None else None
        torch.manual_seed(tc.seed)
        # train() built the module; the ranks and the probe take it as it is
        kernel, no_kernel = training_kernel(build=False) if ctx.device.type == "cpu" else (None, "")
        target = Target(ctx.device, True, self.choices.attention_backend, kernel, no_kernel)
        self.operations = machine_plan(target)
        if ctx.is_main:
            for line in self.operations.describe():
                reporter.emit(Notice(f"plan: {line}", detail=True))
        self.model = Transformer(self.cfg, self.operations.operations).to(ctx.device)
        if resume is not None:
            self.model.load_state_dict(resume.model)
        elif plan.init is not None:  # fine-tuning: its weights, a fresh optimizer and schedule
            self.model.load_state_dict(plan.init.take().model)
            if ctx.is_main:
                reporter.notice(
                    f"fine-tuning from {plan.init.path}: a fresh optimizer and schedule"
                )
        self.optimizer = paper_adam(
            self.model.parameters(), (tc.adam_beta1, tc.adam_beta2), tc.adam_eps
        )
        objective = training_objective(
            self.model, tc.label_smoothing, self.choices, ctx, self.operations.operations.loss_sweep
        )
        self.updater = Updater(
            objective, self.optimizer, self.precision, ctx.device, tc.clip_norm, ctx.world
        )
        self.pos = Position()
        if resume is not None:
            self.pos = restore_train_state(
                resume.train_state or {}, self.optimizer, self.updater.scaler
            )
            if ctx.is_main:
                run.truncate_metrics(self.pos.step)
        self.keeper = CheckpointKeeper(
            run, self.cfg, self.data.vocab, recipe.to_dict(), tc.keep_last, plan.origin
        )
        self.clock = TrainingClock(self.pos.elapsed_s)
        self.device_rate = matmul_rate(ctx.device, dtype_of(self.precision))
        self.validator = (
            Validator(
                self.model,
                self.data,
                recipe,
                self.precision,
                ctx.device,
                self.split,
                multiple,
                ctx,
                self.operations.operations.loss_sweep,
            )
            if "valid" in self.data.splits
            else None
        )
        self.final_dev: DevFigures | None = None
        self.stop_signal = 0  # the signal that stopped the loop, if one did

    def save(self, validate: bool) -> None:
        """A step checkpoint (with dev figures, best) when `validate`, then last.pt. Every
        rank calls it at once and validates its share of the dev set; rank 0 writes."""
        elapsed = self.clock.elapsed()
        figures = self.validator() if validate and self.validator is not None else None
        if not self.ctx.is_main:
            return
        self.pos.elapsed_s = elapsed
        weights = model_state(self.model)
        step_path: Path | None = None
        best = False
        if validate:
            step_path, best = self.keeper.save_step(weights, self.pos, figures)
            self.final_dev = figures
            if self.validator is not None and self.report.draws_attention:
                sample = self.validator.dev.sample()
                maps = attention_of(self.model, self.data.vocab, sample, self.recipe.decode)
                self.report.attention(maps, self.pos.step)
        state = train_state(
            self.optimizer,
            self.updater.scaler,
            self.pos,
            self.tc.seed,
            dataclasses.asdict(self.split),
        )
        self.keeper.save_last(weights, state)
        self.report.checkpoint(self.pos.step, self.pos.elapsed_s, step_path, figures, best)

    def loop(self) -> str:
        """Train until a limit or a signal; returns what stopped it."""
        tc = self.tc
        self.report.open_tensorboard()
        plan = self.feed.plan(self.pos.epoch)
        first = -(-self.pos.batches_done // plan.slots)
        upcoming = range(first, min(first + 3, plan.updates))
        self.report.emit(
            TrainStarted(
                run_dir=self.run.root,
                device=describe_device(self.ctx),
                precision=self.precision,
                split=self.split,
                parameters=count_parameters(self.model),
                train_pairs=len(self.feed.src),
                dev_pairs=len(self.validator.dev) if self.validator is not None else 0,
                updates_per_epoch=plan.updates,
                start_step=self.pos.step,
                max_steps=tc.max_steps,
                threads=torch.get_num_threads(),
                first_updates=[plan.update_real_tokens(u) for u in upcoming],
            )
        )
        said = announcement(self.choices, self.ctx.device)
        if said is not None:
            self.report.notice(said)
        policy = StopPolicy(tc)
        if policy.finished_before_start(self.pos.step):
            return "max_steps"
        tuner = self._thread_tuner()
        attempts = first_attempt = self.pos.step + self.pos.skipped
        stopped_by = "max_epochs"
        if self.choices.compile_model:
            startup_phase("compiling the model in the first update")
        # A compiled model's first update is mostly compilation: a signal stops it at once.
        with StopRequest(immediate=self.choices.compile_model) as stop:
            for plan, update in self.feed.updates(self.pos):
                if tuner is not None:
                    tuner.before_update()
                t0 = time.monotonic()
                lr = paper_learning_rate(
                    self.pos.step + 1, self.cfg.d_model, tc.warmup_steps, tc.lr_scale
                )
                micro = self.feed.micro_batches(plan, update)
                update_tokens = plan.update_tgt_tokens(update)
                pending = self.updater.launch(
                    micro, update_tokens, lr, self.feed.micro_seeds(attempts)
                )
                if self.choices.prefetch:
                    self.feed.prefetch(plan, update + 1)  # while the device works
                stats = pending.result()
                stop.started()
                if attempts == first_attempt and self.choices.compile_model:
                    failure = self.updater.compile_failure
                    if failure is None:
                        self.report.compiled(time.monotonic() - t0, self.pos.step + 1)
                    else:
                        self.report.compile_failed(failure, self.pos.step + 1)
                attempts += 1
                self.pos.batches_done = min(len(plan.batches), (update + 1) * plan.slots)
                self._count(stats)
                self._account(plan, update)
                seconds = time.monotonic() - t0
                if tuner is not None:
                    changed = tuner.after_update(update_tokens, seconds)
                    if changed is not None:
                        self.report.threads_changed(changed, tuner.rate, tuner.options)
                self.report.update(
                    stats,
                    update_tokens,
                    seconds,
                    step=self.pos.step,
                    epoch=self.pos.epoch + 1,
                    lr=lr,
                    elapsed_s=self.pos.elapsed_s,
                    skipped=self.pos.skipped,
                )
                flags = policy.local_flags(self.pos.elapsed_s, stop.signal, self.ctx.is_main)
                decision = policy.decide(self.ctx.all_max(flags), self.pos.step, stats.skipped)
                if decision.stop == "signal":
                    self.stop_signal = decision.signum
                    self.save(validate=False)
                    self.report.notice("interrupted: saved checkpoints/last.pt; rerun to resume")
                    return "signal"
                if decision.stop is not None:
                    stopped_by = decision.stop
                    break
                if decision.save:
                    self.save(validate=True)
                    policy.saved()
        # A final step checkpoint (with dev figures) unless this step already has one;
        # the ranks agree on it, as they validate together.
        saved = self.ctx.all_max([float(self.keeper.has_step(self.pos.step))])[0]
        self.save(validate=not saved)
        return stopped_by

    def _account(self, plan: EpochPlan, update: int) -> None:
        """Advance the clock and both training-cost counters (see core/flops.py)."""
        now = self.clock.elapsed()
        self.pos.device_flops += (now - self.pos.elapsed_s) * self.ctx.world * self.device_rate
        self.pos.elapsed_s = now
        self.pos.train_flops += self.feed.update_flops(plan, update, self.cfg)

    def _thread_tuner(self) -> ThreadTuner | None:
        """Only when the recipe leaves the thread count to us (train.threads = 0) and one
        CPU process trains: an explicit count is kept, and is reproducible."""
        if self.ctx.device.type != "cpu" or self.ctx.distributed or self.tc.threads:
            return None
        most = torch.get_num_threads()
        return ThreadTuner(most) if most > 1 else None

    def _count(self, stats: UpdateStats) -> None:
        """Advance the step, or count a skipped (non-finite) update and give up after
        `max_nonfinite` in a row."""
        if not stats.skipped:
            self.consecutive_bad = 0
            self.pos.step += 1
            return
        self.pos.skipped += 1
        self.consecutive_bad += 1
        self.report.notice(
            f"step {self.pos.step + 1}: non-finite gradient (norm {stats.grad_norm}), "
            f"update skipped ({self.pos.skipped} so far)",
            warning=True,
        )
        if self.consecutive_bad >= self.max_nonfinite:
            raise NmtError(
                f"training stopped: {self.consecutive_bad} updates in a row had non-finite "
                f"gradients; the last good checkpoint is {self.run.last}. Lower "
                "train.lr_scale, set train.clip_norm, or use precision bf16/fp32 instead of fp16"
            )


def _set_threads(recipe: RecipeConfig, ctx: DistContext) -> None:
    if ctx.device.type != "cpu":
        return
    local_procs = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world)))
    # the CPUs this process may use (affinity and cgroup quota), shared by the local ranks
    threads = recipe.train.threads or max(1, usable_cpus() // local_procs)
    torch.set_num_threads(threads)


def _train_rank(
    ctx: DistContext,
    plan: TrainPlan,
    options: TrainOptions,
    on_event: EventSink | None = None,
) -> TrainResult:
    recipe = plan.recipe
    _set_threads(recipe, ctx)
    run = RunDir(plan.run_root)
    if ctx.is_main:
        run.write_config(recipe.to_dict())
    reporter = Reporter(run, recipe.train, on_event, ctx.is_main)
    startup_phase("building the model")
    trainer = _Trainer(ctx, plan, run, reporter, options.max_nonfinite)
    if ctx.is_main:
        run.write_vocab(trainer.data.vocab)
        run.write_data_record(data_record(trainer.data))
    on_cpu = ctx.device.type == "cpu"
    try:
        with reused_heap() if on_cpu else contextlib.nullcontext():
            stopped_by = trainer.loop()
        reporter.finished(stopped_by, trainer.pos.step, trainer.stop_signal)
    finally:
        trainer.feed.close()
        reporter.close()
    return TrainResult(
        run_dir=run.root,
        steps=trainer.pos.step,
        elapsed_s=trainer.pos.elapsed_s,
        last_checkpoint=trainer.keeper.newest_step_file,
        best_checkpoint=run.best if run.best.is_file() else None,
        final_dev_loss=trainer.final_dev.loss if trainer.final_dev else None,
        final_dev_ppl=trainer.final_dev.ppl if trainer.final_dev else None,
        stopped_by=stopped_by,
        skipped_updates=trainer.pos.skipped,
        rank=ctx.rank,
        signal=trainer.stop_signal,
    )
