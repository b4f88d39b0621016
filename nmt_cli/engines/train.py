"""`nmt train`: the paper's training procedure (section 5) on one CPU or many GPUs.

    train(recipe, options, on_event) -> TrainResult

reads the prepared data directory named by the recipe, writes the run directory (see
`run_dir.py`), and resumes from `checkpoints/last.pt` when a previous run left one. Every
rank runs `_train_rank`; only rank 0 writes files and reports events.

Reproducibility: the data order is a pure function of (seed, epoch), the dropout masks of
each micro-batch come from a seed derived from (seed, step, rank, micro-batch), and the
weights, optimizer and position are restored exactly, so an interrupted and resumed run
ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from nmt_cli.config import RecipeConfig, TrainConfig
from nmt_cli.core.batching import Batch, EpochPlan, collate, plan_epoch
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint
from nmt_cli.core.schedule import paper_adam, paper_learning_rate
from nmt_cli.core.transformer import ModelConfig, Transformer, count_parameters
from nmt_cli.core.vocab import PAD_ID, VocabPair
from nmt_cli.data_dir import PreparedData, open_data_dir
from nmt_cli.engines.distributed import DistContext, LaunchSpec, check_devices, launch
from nmt_cli.engines.run_dir import RunDir
from nmt_cli.engines.threads import ThreadTuner
from nmt_cli.engines.train_events import (
    BatchSplit,
    CheckpointSaved,
    Notice,
    StepDone,
    TrainEvent,
    TrainStarted,
)
from nmt_cli.engines.train_step import Updater, UpdateStats, resolve_precision
from nmt_cli.engines.validate import DevFigures, DevSet, dev_loss, greedy_bleu
from nmt_cli.errors import NmtError

EventSink = Callable[[TrainEvent], None]


@dataclass(frozen=True)
class TrainOptions:
    """How to run a recipe's training (the recipe says what to train)."""

    run_dir: str | None = None  # overrides train.run_dir
    gpus: int = 0  # 0 = CPU
    procs: int = 1  # CPU processes over gloo (with gpus == 0)
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


def derive_split(train: TrainConfig, world: int) -> BatchSplit:
    """Per-device max_tokens and accumulation so that world x accum x max_tokens is about
    the recipe's effective batch, whatever the number of devices."""
    share = max(1, math.ceil(train.batch_tokens / world))
    cap = train.max_tokens or share
    accum = max(1, math.ceil(share / cap))
    return BatchSplit(train.batch_tokens, world, accum, math.ceil(share / accum))


def model_config_for(recipe: RecipeConfig, vocab: VocabPair) -> ModelConfig:
    return dataclasses.replace(
        recipe.model,
        src_vocab_size=len(vocab.src),
        tgt_vocab_size=len(vocab.tgt),
        pad_id=PAD_ID,
    )


def check_resumable(ckpt: Checkpoint, cfg: ModelConfig, vocab: VocabPair, path: Path) -> None:
    """Refuse to resume into a different model or vocabulary, naming what changed."""
    changes = [
        f"model.{f.name} {getattr(ckpt.model_config, f.name)!r} -> {getattr(cfg, f.name)!r}"
        for f in dataclasses.fields(ModelConfig)
        if getattr(ckpt.model_config, f.name) != getattr(cfg, f.name)
    ]
    if ckpt.vocab.src.model_proto != vocab.src.model_proto:
        changes.append("the source vocabulary (SentencePiece model) differs from the data's")
    if not vocab.joint and ckpt.vocab.tgt.model_proto != vocab.tgt.model_proto:
        changes.append("the target vocabulary (SentencePiece model) differs from the data's")
    if changes:
        raise NmtError(
            f"{path}: cannot resume, the run was trained with a different setup: "
            + "; ".join(changes)
            + ". Restore the recipe and data, or train into a new --run-dir"
        )
    if ckpt.kind != "train" or ckpt.train_state is None:
        raise NmtError(f"{path}: not a training checkpoint (kind {ckpt.kind!r}); cannot resume")


def train(
    recipe: RecipeConfig,
    options: TrainOptions | None = None,
    on_event: EventSink | None = None,
) -> TrainResult:
    """Train `recipe`'s model; resumes when the run directory has a last checkpoint."""
    options = options or TrainOptions()
    spec = LaunchSpec(options.gpus, options.procs, options.dist_timeout_s)
    check_devices(spec)
    run = RunDir(options.run_dir or recipe.train.run_dir)
    # Checks that would fail identically on every rank run once, here, with one message.
    data = open_data_dir(recipe.data.dir)
    cfg = model_config_for(recipe, data.vocab)
    if run.last.is_file():
        check_resumable(load_checkpoint(run.last), cfg, data.vocab, run.last)
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    if is_rank0:
        run.acquire_lock()
        run.remove_partial_writes()  # safe: the lock says no other writer is alive
    try:
        result: TrainResult = launch(spec, _train_rank, (recipe, run.root, options), (on_event,))
        return result
    finally:
        if is_rank0:
            run.release_lock()


class _StopRequest:
    """SIGINT/SIGTERM set a flag that the loop checks between updates; a second SIGINT
    interrupts at once."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum

    def __enter__(self) -> _StopRequest:
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: no signal handling
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class _Position:
    epoch: int = 0
    batches_done: int = 0  # batches of this epoch consumed (all ranks)
    step: int = 0
    elapsed_s: float = 0.0
    skipped: int = 0
    best_dev_loss: float | None = None


class _Meter:
    """Throughput over the last 20 updates, and loss and gradient-norm sums since the last
    metrics record."""

    def __init__(self) -> None:
        self.window: deque[tuple[float, int]] = deque(maxlen=20)
        self.loss = self.nll = self.grad_norm = 0.0
        self.tokens = self.updates = 0

    def add(self, seconds: float, update_tokens: int, stats: UpdateStats) -> None:
        self.window.append((seconds, update_tokens))
        if not stats.skipped:
            self.loss += stats.loss_sum
            self.nll += stats.nll_sum
            self.tokens += stats.tokens
            self.grad_norm += stats.grad_norm
            self.updates += 1

    @property
    def tokens_per_s(self) -> float:
        return sum(n for _, n in self.window) / max(sum(t for t, _ in self.window), 1e-9)

    @property
    def seconds_per_update(self) -> float:
        return sum(t for t, _ in self.window) / max(len(self.window), 1)

    def take(self) -> tuple[float, float, float]:
        """(loss, nll) per token and the mean gradient norm (before clipping) since the
        last call."""
        loss, nll = self.loss / self.tokens, self.nll / self.tokens
        grad_norm = self.grad_norm / max(self.updates, 1)
        self.loss = self.nll = self.grad_norm = 0.0
        self.tokens = self.updates = 0
        return loss, nll, grad_norm


class _Trainer:
    """Rank-local training state and the loop; rank 0 also writes and reports."""

    def __init__(
        self,
        ctx: DistContext,
        recipe: RecipeConfig,
        run: RunDir,
        on_event: EventSink | None,
        max_nonfinite: int,
    ) -> None:
        self.ctx, self.recipe, self.run = ctx, recipe, run
        self.max_nonfinite = max_nonfinite
        self.consecutive_bad = 0
        self.tc = recipe.train
        self.on_event = on_event if ctx.is_main else None
        self.data: PreparedData = open_data_dir(recipe.data.dir)
        self.train_src, self.train_tgt = self.data.split("train")
        self.split = derive_split(self.tc, ctx.world)
        self.cfg = model_config_for(recipe, self.data.vocab)
        longest = int(
            max(self.train_src.lengths.max(initial=0), self.train_tgt.lengths.max(initial=0))
        )
        if longest + 1 > self.cfg.max_positions:
            raise NmtError(
                f"the training data has sentences of {longest} tokens but model.max_positions "
                f"is {self.cfg.max_positions}; raise model.max_positions or lower data.max_len"
            )
        self.precision = resolve_precision(self.tc.precision, ctx.device)
        self.dev: DevSet | None = None
        if ctx.is_main and "valid" in self.data.splits:
            self.dev = DevSet(*self.data.split("valid"), max_tokens=self.split.max_tokens)
        self.pos = _Position()
        resume = load_checkpoint(run.last) if run.last.is_file() else None
        torch.manual_seed(self.tc.seed)
        self.model = Transformer(self.cfg).to(ctx.device)
        if resume is not None:
            self.model.load_state_dict(resume.model)
        self.optimizer = paper_adam(
            self.model.parameters(), (self.tc.adam_beta1, self.tc.adam_beta2), self.tc.adam_eps
        )
        self.ddp: torch.nn.Module = self.model
        if ctx.distributed:
            self.ddp = DistributedDataParallel(
                self.model,
                device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
                forward_sync_buffers=False,  # the only buffer is the fixed position table
                gradient_as_bucket_view=True,
            )
        self.updater = Updater(
            self.ddp,
            self.optimizer,
            self.precision,
            ctx.device,
            self.tc.label_smoothing,
            PAD_ID,
            self.tc.clip_norm,
            ctx.world,
        )
        if resume is not None:
            self._restore(resume.train_state or {})
            if ctx.is_main:
                run.truncate_metrics(self.pos.step)
        self.start_step = self.pos.step
        existing = run.step_checkpoints()
        self.last_step_file: Path | None = existing[-1] if existing else None
        self._clock_base = self.pos.elapsed_s  # training time before this process
        self._clock_start = time.monotonic()
        self.final_dev: DevFigures | None = None
        self.tensorboard: Any = None

    # -- state --------------------------------------------------------------------------

    def _restore(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.updater.scaler is not None and state.get("scaler"):
            self.updater.scaler.load_state_dict(state["scaler"])
        self.pos = _Position(
            epoch=int(state["epoch"]),
            batches_done=int(state["batches_done"]),
            step=int(state["step"]),
            elapsed_s=float(state["elapsed_s"]),
            skipped=int(state.get("skipped", 0)),
            best_dev_loss=state.get("best_dev_loss"),
        )
        if "rng_torch" in state:
            torch.set_rng_state(state["rng_torch"])

    def _train_state(self) -> dict[str, Any]:
        scaler = self.updater.scaler
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "epoch": self.pos.epoch,
            "batches_done": self.pos.batches_done,
            "step": self.pos.step,
            "elapsed_s": self.pos.elapsed_s,
            "skipped": self.pos.skipped,
            "best_dev_loss": self.pos.best_dev_loss,
            "rng_torch": torch.get_rng_state(),
            "seed": self.tc.seed,
            "split": dataclasses.asdict(self.split),
        }

    # -- reporting ----------------------------------------------------------------------

    def emit(self, event: TrainEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _log(self, record: dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        self.run.append_metrics(record)
        if self.tensorboard is not None:
            for key, value in record.items():
                if key not in ("type", "step") and isinstance(value, int | float):
                    self.tensorboard.add_scalar(f"{record['type']}/{key}", value, record["step"])

    def _open_tensorboard(self) -> None:
        if not (self.ctx.is_main and self.tc.tensorboard):
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.emit(
                Notice(
                    "train.tensorboard is set but tensorboard is not installed; "
                    "metrics.jsonl has the same figures",
                    warning=True,
                )
            )
            return
        self.tensorboard = SummaryWriter(str(self.run.root / "tensorboard"))

    # -- checkpoints --------------------------------------------------------------------

    def _validate(self) -> DevFigures | None:
        if self.dev is None:
            return None
        loss, nll = dev_loss(
            self.model, self.dev, self.tc.label_smoothing, self.precision, self.ctx.device
        )
        bleu = None
        if self.tc.validate_bleu_sentences > 0:
            bleu = greedy_bleu(
                self.model,
                self.dev,
                self.data.vocab.tgt,
                self.tc.validate_bleu_sentences,
                self.data.raw_text("valid", "tgt"),
                self.recipe.decode.max_len_a,
                self.recipe.decode.max_len_b,
                self.precision,
                self.ctx.device,
            )
        return DevFigures(loss, nll, bleu)

    def _tick(self) -> None:
        """Training time is wall-clock time (validation and saving included), summed over
        every process that worked on the run, so max_time means what a person expects."""
        self.pos.elapsed_s = self._clock_base + time.monotonic() - self._clock_start

    def save(self, validate: bool) -> None:
        """Rank 0: step checkpoint (+ dev figures, best) when `validate`, then last.pt."""
        if not self.ctx.is_main:
            return
        self._tick()
        weights = model_state(self.model)
        recipe = self.recipe.to_dict()
        step_path: Path | None = None
        figures: DevFigures | None = None
        best = False
        if validate:
            figures = self._validate()
            meta: dict[str, Any] = {"epoch": self.pos.epoch, "elapsed_s": self.pos.elapsed_s}
            if figures is not None:
                meta.update(dev_loss=figures.loss, dev_nll=figures.nll, dev_ppl=figures.ppl)
                if figures.bleu is not None:
                    meta["dev_bleu"] = figures.bleu
                best = self.pos.best_dev_loss is None or figures.loss < self.pos.best_dev_loss
                if best:
                    self.pos.best_dev_loss = figures.loss
            step_path = save_checkpoint(
                Checkpoint(
                    self.cfg,
                    self.data.vocab,
                    weights,
                    self.pos.step,
                    "inference",
                    recipe,
                    None,
                    meta,
                ),
                self.run.step_path(self.pos.step),
            )
            self.last_step_file = step_path
            if best:
                self.run.copy_to_best(step_path)
            self.run.rotate(self.tc.keep_last)
            self.final_dev = figures
            if figures is not None:
                self._log(
                    {
                        "type": "valid",
                        "step": self.pos.step,
                        "dev_loss": figures.loss,
                        "dev_nll": figures.nll,
                        "dev_ppl": figures.ppl,
                        **({"dev_bleu": figures.bleu} if figures.bleu is not None else {}),
                        "elapsed_s": self.pos.elapsed_s,
                    }
                )
        save_checkpoint(
            Checkpoint(
                self.cfg,
                self.data.vocab,
                weights,
                self.pos.step,
                "train",
                recipe,
                self._train_state(),
                {},
            ),
            self.run.last,
        )
        self.emit(
            CheckpointSaved(
                step=self.pos.step,
                path=step_path,
                dev_loss=figures.loss if figures else None,
                dev_ppl=figures.ppl if figures else None,
                dev_bleu=figures.bleu if figures else None,
                best=best,
                elapsed_s=self.pos.elapsed_s,
            )
        )

    # -- the loop -----------------------------------------------------------------------

    def _plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(
            self.train_src.lengths,
            self.train_tgt.lengths,
            self.split.max_tokens,
            self.tc.seed,
            epoch,
            self.ctx.world,
            self.split.accum,
        )

    def _micro_batches(self, plan: EpochPlan, update: int) -> list[tuple[Batch, float]]:
        slots = plan.rank_slots(update, self.ctx.rank)
        stand_in = update * plan.slots  # the update's first batch always exists
        out = []
        for slot in slots:
            index = stand_in if slot is None else slot
            batch = collate(self.train_src, self.train_tgt, plan.batches[index])
            out.append((batch.to(self.ctx.device), 0.0 if slot is None else 1.0))
        return out

    def _updates(self) -> Iterator[tuple[EpochPlan, int]]:
        """(plan, update index) from the saved position on, epoch after epoch."""
        while True:
            if self.tc.max_epochs and self.pos.epoch >= self.tc.max_epochs:
                return
            plan = self._plan(self.pos.epoch)
            if plan.updates == 0:
                raise NmtError(f"{self.data.root}: the training split is empty")
            first = -(-self.pos.batches_done // plan.slots)
            for update in range(first, plan.updates):
                yield plan, update
            self.pos.epoch += 1
            self.pos.batches_done = 0

    def _micro_seeds(self, attempt: int) -> list[int]:
        """Dropout seeds of this rank's micro-batches, from their global slot in the update:
        one process accumulating two batches draws the same masks as two ranks."""
        first = self.tc.seed * 2**40 + attempt * 2**20 + self.ctx.rank * self.split.accum
        return [first + i for i in range(self.split.accum)]

    def loop(self) -> str:
        tc = self.tc
        self._open_tensorboard()
        plan0 = self._plan(self.pos.epoch)
        self.emit(
            TrainStarted(
                run_dir=self.run.root,
                device=_describe_device(self.ctx),
                precision=self.precision,
                split=self.split,
                parameters=count_parameters(self.model),
                train_pairs=len(self.train_src),
                dev_pairs=len(self.dev) if self.dev is not None else 0,
                updates_per_epoch=plan0.updates,
                start_step=self.pos.step,
                max_steps=tc.max_steps,
                threads=torch.get_num_threads(),
            )
        )
        if tc.max_steps and self.pos.step >= tc.max_steps:
            return "max_steps"
        meter = _Meter()
        tuner = self._thread_tuner()
        last_save = time.monotonic()
        attempts = self.pos.step + self.pos.skipped
        stopped_by = "max_epochs"
        with _StopRequest() as stop:
            for plan, update in self._updates():
                if tuner is not None:
                    tuner.before_update()
                t0 = time.monotonic()
                lr = paper_learning_rate(
                    self.pos.step + 1, self.cfg.d_model, tc.warmup_steps, tc.lr_scale
                )
                stats = self.updater.update(
                    self._micro_batches(plan, update),
                    plan.update_tgt_tokens(update),
                    lr,
                    self._micro_seeds(attempts),
                )
                attempts += 1
                self.pos.batches_done = min(len(plan.batches), (update + 1) * plan.slots)
                self._count(stats)
                self._tick()
                seconds = time.monotonic() - t0
                meter.add(seconds, plan.update_tgt_tokens(update), stats)
                if tuner is not None:
                    self._retune(tuner, plan.update_tgt_tokens(update), seconds)
                self._report(stats, lr, meter)
                # Decisions that depend on a clock or a signal are rank 0's (or any rank's
                # signal), agreed on by every rank so that all stop at the same update.
                time_due = bool(
                    tc.save_interval_minutes
                    and time.monotonic() - last_save >= tc.save_interval_minutes * 60
                )
                out_of_time = bool(
                    tc.max_time_minutes and self.pos.elapsed_s >= tc.max_time_minutes * 60
                )
                signalled, time_due_all, out_of_time_all = self.ctx.all_max(
                    [
                        float(stop.signal is not None),
                        float(time_due and self.ctx.is_main),
                        float(out_of_time and self.ctx.is_main),
                    ]
                )
                steps_due = bool(
                    tc.save_interval_steps
                    and not stats.skipped
                    and self.pos.step % tc.save_interval_steps == 0
                )
                finished = bool(tc.max_steps and self.pos.step >= tc.max_steps)
                if signalled:
                    self.save(validate=False)
                    self.emit(Notice("interrupted: saved checkpoints/last.pt; rerun to resume"))
                    return "signal"
                if finished or out_of_time_all:
                    stopped_by = "max_steps" if finished else "max_time"
                    break
                if steps_due or time_due_all:
                    self.save(validate=True)
                    last_save = time.monotonic()
        # A final step checkpoint (with dev figures) unless this step already has one.
        self.save(validate=not self.run.step_path(self.pos.step).is_file())
        return stopped_by

    def _thread_tuner(self) -> ThreadTuner | None:
        """Only when the recipe leaves the thread count to us (train.threads = 0) and one
        CPU process trains: an explicit count is kept, and is reproducible."""
        if self.ctx.device.type != "cpu" or self.ctx.distributed or self.tc.threads:
            return None
        most = torch.get_num_threads()
        return ThreadTuner(most) if most > 1 else None

    def _retune(self, tuner: ThreadTuner, tokens: int, seconds: float) -> None:
        changed = tuner.after_update(tokens, seconds)
        if changed is None:
            return
        rates = ", ".join(f"{n} thread(s) {r:,.0f} tok/s" for n, r in sorted(tuner.rate.items()))
        why = (
            "other processes compete for the cores"
            if changed < max(tuner.options)
            else "the cores are free again"
        )
        self.emit(Notice(f"CPU threads: now {changed} ({rates}); {why}"))

    def _count(self, stats: UpdateStats) -> None:
        """Advance the step, or count a skipped (non-finite) update and give up after
        `max_nonfinite` in a row."""
        if not stats.skipped:
            self.consecutive_bad = 0
            self.pos.step += 1
            return
        self.pos.skipped += 1
        self.consecutive_bad += 1
        self.emit(
            Notice(
                f"step {self.pos.step + 1}: non-finite gradient (norm {stats.grad_norm}), "
                f"update skipped ({self.pos.skipped} so far)",
                warning=True,
            )
        )
        if self.consecutive_bad >= self.max_nonfinite:
            raise NmtError(
                f"training stopped: {self.consecutive_bad} updates in a row had non-finite "
                f"gradients; the last good checkpoint is {self.run.last}. Lower "
                "train.lr_scale, set train.clip_norm, or use precision bf16/fp32 instead of fp16"
            )

    def _report(self, stats: UpdateStats, lr: float, meter: _Meter) -> None:
        tokens = max(stats.tokens, 1)
        self.emit(
            StepDone(
                step=self.pos.step,
                epoch=self.pos.epoch + 1,
                loss=stats.loss_sum / tokens,
                nll=stats.nll_sum / tokens,
                lr=lr,
                grad_norm=stats.grad_norm,
                tokens_per_s=meter.tokens_per_s,
                elapsed_s=self.pos.elapsed_s,
                remaining_s=self._remaining(meter),
                skipped=self.pos.skipped,
            )
        )
        log_every = self.tc.log_interval_steps
        if log_every and self.pos.step % log_every == 0 and meter.tokens:
            loss, nll, grad_norm = meter.take()
            self._log(
                {
                    "type": "train",
                    "step": self.pos.step,
                    "epoch": self.pos.epoch + 1,
                    "loss": loss,
                    "nll": nll,
                    "ppl": math.exp(min(nll, 100.0)),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": meter.tokens_per_s,
                    "elapsed_s": self.pos.elapsed_s,
                }
            )

    def _remaining(self, meter: _Meter) -> float | None:
        per_step = meter.seconds_per_update
        estimates = []
        if self.tc.max_steps:
            estimates.append(max(0, self.tc.max_steps - self.pos.step) * per_step)
        if self.tc.max_time_minutes:
            estimates.append(max(0.0, self.tc.max_time_minutes * 60 - self.pos.elapsed_s))
        return min(estimates) if estimates else None


def _describe_device(ctx: DistContext) -> str:
    if ctx.device.type == "cuda":
        name = torch.cuda.get_device_name(ctx.device)
        return f"{ctx.world} x {name} (nccl)" if ctx.distributed else name
    if ctx.distributed:
        return f"cpu, {ctx.world} processes (gloo)"
    return "cpu"


def _set_threads(recipe: RecipeConfig, ctx: DistContext) -> None:
    if ctx.device.type != "cpu":
        return
    local_procs = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world)))
    threads = recipe.train.threads or max(1, (os.cpu_count() or 1) // local_procs)
    torch.set_num_threads(threads)


def _train_rank(
    ctx: DistContext,
    recipe: RecipeConfig,
    run_root: Path,
    options: TrainOptions,
    on_event: EventSink | None = None,
) -> TrainResult:
    _set_threads(recipe, ctx)
    run = RunDir(run_root)
    if ctx.is_main:
        run.write_config(recipe.to_dict())
    trainer = _Trainer(ctx, recipe, run, on_event, options.max_nonfinite)
    if ctx.is_main:
        run.write_vocab(trainer.data.vocab)
    stopped_by = trainer.loop()
    if trainer.tensorboard is not None:
        trainer.tensorboard.close()
    return TrainResult(
        run_dir=run.root,
        steps=trainer.pos.step,
        elapsed_s=trainer.pos.elapsed_s,
        last_checkpoint=trainer.last_step_file,
        best_checkpoint=run.best if run.best.is_file() else None,
        final_dev_loss=trainer.final_dev.loss if trainer.final_dev else None,
        final_dev_ppl=trainer.final_dev.ppl if trainer.final_dev else None,
        stopped_by=stopped_by,
        skipped_updates=trainer.pos.skipped,
        rank=ctx.rank,
    )
