"""What a run tells the world: events for the display, `metrics.jsonl`, TensorBoard.

Only rank 0 reports. Events go to the caller's `on_event` (the CLI draws them, `nmt run`
and tests consume them); log records go to `metrics.jsonl` every `log_interval_steps`
updates and at every validation, and to TensorBoard when it is installed (unless the
recipe says `train.tensorboard = false`): the same scalars, plus at every validation the
attention of one fixed dev sentence as images, one per layer of each attention kind.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nmt_cli.config import TrainConfig
from nmt_cli.engines.train.events import (
    CheckpointSaved,
    Notice,
    StepDone,
    TrainEvent,
    TrainStarted,
)
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.engines.train.step import UpdateStats
from nmt_cli.engines.train.validate import DevFigures
from nmt_cli.optional import MissingPackage, require

if TYPE_CHECKING:
    from nmt_cli.engines.translate.attention import AttentionMaps

EventSink = Callable[[TrainEvent], None]


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line: its type, and the first line of the error underneath
    it (a compiler's error wraps the one that stopped it: `inner_exception` in
    torch._dynamo's BackendCompilerFailed, otherwise the exception's cause)."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    shown = inner if isinstance(inner, BaseException) else exc
    lines = [line.strip() for line in str(shown).splitlines() if line.strip()]
    names = type(exc).__name__ + (f": {type(shown).__name__}" if shown is not exc else "")
    text = f"{names}: {lines[0]}" if lines else names
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Meter:
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
        """(loss, nll) per token and the mean gradient norm (before clipping) of the
        updates since the last call."""
        loss, nll = self.loss / self.tokens, self.nll / self.tokens
        grad_norm = self.grad_norm / max(self.updates, 1)
        self.loss = self.nll = self.grad_norm = 0.0
        self.tokens = self.updates = 0
        return loss, nll, grad_norm


class Reporter:
    """Rank 0's events and logs; on other ranks every method does nothing."""

    def __init__(
        self, run: RunDir, tc: TrainConfig, on_event: EventSink | None, is_main: bool
    ) -> None:
        self.run, self.tc, self.is_main = run, tc, is_main
        self.on_event = on_event if is_main else None
        self.meter = Meter()
        self.tensorboard: Any = None

    def emit(self, event: TrainEvent) -> None:
        if self.is_main:
            self._log_event(event)
        if self.on_event is not None:
            self.on_event(event)

    def _log_event(self, event: TrainEvent) -> None:
        """train.log: what a person watching the terminal would have read (every event
        but the per-update ones, which metrics.jsonl and the log interval cover)."""
        if isinstance(event, TrainStarted):
            what = f"resuming at step {event.start_step:,}" if event.start_step else "starting"
            self.run.log(
                f"{what}: {event.device}, {event.threads} thread(s), {event.precision}, "
                f"{event.parameters:,} parameters, {event.train_pairs:,} training pairs, "
                f"batch {event.split.describe()}"
            )
        elif isinstance(event, CheckpointSaved):
            where = event.path.name if event.path is not None else "last.pt"
            dev = f", dev loss {event.dev_loss:.4f}" if event.dev_loss is not None else ""
            bleu = f", dev BLEU {event.dev_bleu:.2f}" if event.dev_bleu is not None else ""
            best = " (best)" if event.best else ""
            self.run.log(f"step {event.step:,}: saved {where}{dev}{bleu}{best}")
        elif isinstance(event, Notice):
            self.run.log(("warning: " if event.warning else "") + event.text)

    def finished(self, stopped_by: str, step: int, signum: int = 0) -> None:
        if self.is_main:
            why = f"signal {signum}" if stopped_by == "signal" and signum else stopped_by
            self.run.log(f"stopped at step {step:,} by {why.replace('_', ' ')}")

    def notice(self, text: str, warning: bool = False) -> None:
        self.emit(Notice(text, warning))

    def compiled(self, seconds: float, step: int) -> None:
        """The first compiled update's time: compilation plus one step."""
        self.notice(f"torch.compile: the first update took {seconds:.1f} s, compilation included")
        self.log({"type": "compile", "step": step, "first_update_s": seconds})

    def compile_failed(self, cause: Exception, step: int) -> None:
        """The compiler failed at the first compiled update, which ran eagerly instead."""
        why = one_line(cause)
        self.notice(
            f"torch.compile failed at the first update ({why}); training goes on without "
            "compiling. train.compile = false (--set train.compile=false) skips compilation",
            warning=True,
        )
        self.log({"type": "compile", "step": step, "fallback": "eager", "error": why})

    def open_tensorboard(self) -> None:
        """Into `<run>/tensorboard` when tensorboard is installed; "auto" (the default)
        passes over its absence in silence, `true` warns."""
        if not self.is_main or self.tc.tensorboard is False:
            return
        try:
            writer = require(
                "torch.utils.tensorboard",
                purpose="writing TensorBoard logs (train.tensorboard = true)",
                avoid="set train.tensorboard = false (metrics.jsonl has the same figures)",
            )
        except MissingPackage as exc:
            if self.tc.tensorboard is True:
                self.notice(str(exc), warning=True)
            return
        self.tensorboard = writer.SummaryWriter(str(self.run.root / "tensorboard"))

    @property
    def draws_attention(self) -> bool:
        return self.tensorboard is not None

    def attention(self, maps: AttentionMaps, step: int) -> None:
        """One dev sentence's attention at `step`: an image per layer of each kind (heads
        side by side), and the translation and the tokens as text."""
        if self.tensorboard is None:
            return
        from nmt_cli.engines.pictures.tensorboard_images import heads_image, tokens_text

        tb = self.tensorboard
        tb.add_text("attention/translation", f"{maps.source_text}  \n→ {maps.translation}", step)
        for kind, weights, rows, cols in (
            ("encoder", maps.encoder, maps.source, maps.source),
            ("decoder", maps.decoder, maps.target, maps.decoder_inputs),
            ("cross", maps.cross, maps.target, maps.source),
        ):
            tb.add_text(f"attention/{kind}/tokens", tokens_text(rows, cols), step)
            for layer in range(weights.shape[0]):
                tb.add_image(
                    f"attention/{kind}/layer{layer + 1}", heads_image(weights[layer]), step
                )

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def log(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.run.append_metrics(record)
        if record.get("type") == "train":
            self.run.log(
                f"step {record['step']:,}: loss {record['loss']:.4f}, ppl {record['ppl']:.2f}, "
                f"lr {record['lr']:.3g}, {record['tokens_per_s']:,.0f} tok/s"
            )
        if self.tensorboard is not None:
            for key, value in record.items():
                if key not in ("type", "step") and isinstance(value, int | float):
                    self.tensorboard.add_scalar(f"{record['type']}/{key}", value, record["step"])

    def update(
        self,
        stats: UpdateStats,
        update_tokens: int,
        seconds: float,
        *,
        step: int,
        epoch: int,
        lr: float,
        elapsed_s: float,
        skipped: int,
    ) -> None:
        """After every update: a StepDone event, and a metrics record every log interval."""
        self.meter.add(seconds, update_tokens, stats)
        tokens = max(stats.tokens, 1)
        self.emit(
            StepDone(
                step=step,
                epoch=epoch,
                loss=stats.loss_sum / tokens,
                nll=stats.nll_sum / tokens,
                lr=lr,
                grad_norm=stats.grad_norm,
                tokens_per_s=self.meter.tokens_per_s,
                elapsed_s=elapsed_s,
                remaining_s=self.remaining(step, elapsed_s),
                skipped=skipped,
            )
        )
        log_every = self.tc.log_interval_steps
        if log_every and step % log_every == 0 and self.meter.tokens:
            loss, nll, grad_norm = self.meter.take()
            self.log(
                {
                    "type": "train",
                    "step": step,
                    "epoch": epoch,
                    "loss": loss,
                    "nll": nll,
                    "ppl": math.exp(min(nll, 100.0)),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": self.meter.tokens_per_s,
                    "elapsed_s": elapsed_s,
                }
            )

    def checkpoint(
        self,
        step: int,
        elapsed_s: float,
        path: Any = None,
        figures: DevFigures | None = None,
        best: bool = False,
    ) -> None:
        """After a save: the dev figures into the log (when validated) and an event."""
        if figures is not None:
            self.log(
                {
                    "type": "valid",
                    "step": step,
                    "dev_loss": figures.loss,
                    "dev_nll": figures.nll,
                    "dev_ppl": figures.ppl,
                    **({"dev_bleu": figures.bleu} if figures.bleu is not None else {}),
                    "elapsed_s": elapsed_s,
                }
            )
        self.emit(
            CheckpointSaved(
                step=step,
                path=path,
                dev_loss=figures.loss if figures else None,
                dev_ppl=figures.ppl if figures else None,
                dev_bleu=figures.bleu if figures else None,
                best=best,
                elapsed_s=elapsed_s,
            )
        )

    def remaining(self, step: int, elapsed_s: float) -> float | None:
        """Estimated seconds to max_steps or max_time, whichever comes first."""
        per_step = self.meter.seconds_per_update
        estimates = []
        if self.tc.max_steps:
            estimates.append(max(0, self.tc.max_steps - step) * per_step)
        if self.tc.max_time_minutes:
            estimates.append(max(0.0, self.tc.max_time_minutes * 60 - elapsed_s))
        return min(estimates) if estimates else None

    def threads_changed(self, now: int, rates: dict[int, float], options: list[int]) -> None:
        listed = ", ".join(f"{n} thread(s) {r:,.0f} tok/s" for n, r in sorted(rates.items()))
        why = (
            "other processes compete for the cores"
            if now < max(options)
            else "the cores are free again"
        )
        self.notice(f"CPU threads: now {now} ({listed}); {why}")
