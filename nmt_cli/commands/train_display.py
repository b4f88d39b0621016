"""The rich display of a training run: start banner, live progress, checkpoint lines, summary."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from nmt_cli.engines.train import TrainResult
from nmt_cli.engines.train.events import (
    CheckpointSaved,
    Notice,
    StepDone,
    TrainEvent,
    TrainStarted,
)


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _real_tokens(updates: list[tuple[int, int]]) -> str:
    return ", ".join(f"{src:,} source / {tgt:,} target tokens" for src, tgt in updates) or "-"


class TrainDisplay:
    """Consumes the engine's events (rank 0 only); all output goes to `console` (stderr)."""

    def __init__(self, console: Console, quiet: bool = False, verbose: bool = False) -> None:
        """`quiet`: warnings only, no banner, progress or checkpoint lines; `verbose`: the
        details too, such as the plan of operations (train.log in the run directory has
        them all)."""
        self.console = console
        self.quiet, self.verbose = quiet, verbose
        self.progress = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[stats]}"),
            console=console,
            transient=True,
            disable=quiet or not console.is_terminal,
        )
        self.task: TaskID | None = None
        self.root = ""

    def __call__(self, event: TrainEvent) -> None:
        if self.quiet and not (isinstance(event, Notice) and event.warning):
            return
        if isinstance(event, Notice) and event.detail and not self.verbose:
            return
        if isinstance(event, TrainStarted):
            self._started(event)
        elif isinstance(event, StepDone):
            self._step(event)
        elif isinstance(event, CheckpointSaved):
            self._checkpoint(event)
        elif isinstance(event, Notice):
            if event.warning:
                self.console.print(
                    f"[yellow]warning:[/] {escape(event.text)}", highlight=False, soft_wrap=True
                )
            else:
                self.console.print(
                    f"[cyan]{escape(event.text)}[/]", highlight=False, soft_wrap=True
                )

    def _started(self, e: TrainStarted) -> None:
        self.root = str(e.run_dir)
        what = f"resuming at step {e.start_step:,}" if e.start_step else "starting"
        self.console.print(
            f"[bold]nmt train[/] {what} in {e.run_dir}\n"
            f"  device {e.device}, {e.threads} thread(s), precision {e.precision}, "
            f"{e.parameters:,} parameters\n"
            f"  batch: {e.split.describe()}\n"
            f"  first updates: {_real_tokens(e.first_updates)}\n"
            f"  data: {e.train_pairs:,} training pairs ({e.updates_per_epoch:,} updates an "
            f"epoch), {e.dev_pairs:,} dev pairs",
            highlight=False,
            soft_wrap=True,
        )
        self.task = self.progress.add_task(
            "train", total=e.max_steps or None, completed=e.start_step, stats=""
        )
        self.progress.start()

    def _step(self, e: StepDone) -> None:
        if self.task is None:
            return
        stats = (
            f"step {e.step:,}  ep {e.epoch}  loss {e.loss:.3f}  ppl {math.exp(min(e.nll, 50)):.1f}"
            f"  lr {e.lr:.2e}  {e.tokens_per_s:,.0f} tok/s  {duration(e.elapsed_s)}"
            f" (left {duration(e.remaining_s)})"
        )
        if e.skipped:
            stats += f"  skipped {e.skipped}"
        self.progress.update(self.task, completed=e.step, stats=stats)

    def _checkpoint(self, e: CheckpointSaved) -> None:
        where = e.path.name if e.path is not None else "last.pt"
        figures = ""
        if e.dev_loss is not None and e.dev_ppl is not None:
            figures = f"  dev loss {e.dev_loss:.3f}  ppl {e.dev_ppl:.2f}"
        if e.dev_bleu is not None:
            figures += f"  bleu {e.dev_bleu:.1f}"
        best = "  [green]best[/]" if e.best else ""
        self.console.print(
            f"step {e.step:>8,}  {duration(e.elapsed_s)}{figures}{best}  -> {where}",
            highlight=False,
            soft_wrap=True,
        )

    def close(self) -> None:
        self.progress.stop()


def summary_table(result: TrainResult) -> Table:
    table = Table(title="training summary", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("run directory", str(result.run_dir))
    table.add_row("steps", f"{result.steps:,}")
    table.add_row("stopped by", result.stopped_by.replace("_", " "))
    table.add_row("training time", duration(result.elapsed_s))
    if result.final_dev_loss is not None:
        table.add_row("final dev loss", f"{result.final_dev_loss:.3f} (label-smoothed)")
    if result.final_dev_ppl is not None:
        table.add_row("final dev perplexity", f"{result.final_dev_ppl:.2f}")
    table.add_row("last checkpoint", str(result.last_checkpoint or "-"))
    table.add_row("best checkpoint", str(result.best_checkpoint or "-"))
    if result.skipped_updates:
        table.add_row("skipped updates", f"{result.skipped_updates:,} (non-finite)")
    return table
