"""`nmt train`: train a recipe's model (or, with --dry-run, build and describe it)."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import typer
from rich.table import Table

from nmt_cli.commands.common import (
    SET_HELP,
    Verbosity,
    err_console,
    quiet_option,
    recipe_from_cli,
    startup_printer,
    user_errors,
    verbose_option,
)
from nmt_cli.config import RecipeConfig
from nmt_cli.errors import Interrupted, UsageError


def train(
    recipe: Path = typer.Argument(
        ..., metavar="RECIPE", help="Recipe TOML file, e.g. recipes/base.toml."
    ),
    gpus: int = typer.Option(0, "--gpus", help="GPUs, one DDP process each; 0 = the CPU."),
    procs: int | None = typer.Option(
        None,
        "--procs",
        help="CPU processes (gloo); default: measured at start.",
    ),
    run_dir: str | None = typer.Option(
        None, "--run-dir", help="Run directory; default: the recipe's train.run_dir."
    ),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    init: Path | None = typer.Option(
        None, "--init", metavar="CHECKPOINT", help="Fine-tune: start from its weights."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Build the model, print a summary; touch no data."
    ),
    vocab_size: int | None = typer.Option(
        None, "--vocab-size", help="Vocabulary size for --dry-run without data."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Train the recipe's model on its data directory.

    The data directory is the recipe's data.dir, written by `nmt prepare`.

    --init (train.init_from) fine-tunes a checkpoint, trained or imported: its
    weights and architecture, the recipe's dropout, a fresh optimizer and
    schedule. Its vocabulary must have encoded the data: see
    nmt prepare --vocab-from.

    Rerunning the same command on a run directory resumes from checkpoints/last.pt.
    Ctrl-C (SIGINT) or SIGTERM saves checkpoints/last.pt and exits with 130 or 143, so
    `nmt train ... && nmt average-checkpoints ...` stops there; before the first update
    (start-up: --verbose names its phases) it stops at once. Under torchrun, RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from the environment.
    """
    from nmt_cli.interrupts import stoppable_startup

    verbosity = Verbosity(quiet, verbose)
    # Before PyTorch is imported: a signal then already stops the command at once.
    with user_errors(verbose), stoppable_startup(startup_printer(verbosity), exit_on_stall=True):
        from nmt_cli.commands.train_display import TrainDisplay, summary_table
        from nmt_cli.engines.train import TrainOptions
        from nmt_cli.engines.train import train as run_training

        for flag, value in (("--gpus", gpus), ("--procs", procs or 0)):
            if value < 0:
                raise UsageError(f"{flag} must not be negative, got {value}")
        if vocab_size is not None and vocab_size < 8:
            raise UsageError(f"--vocab-size must be at least 8, got {vocab_size}")
        cfg = recipe_from_cli(str(recipe), set_)
        if init is not None:
            train_cfg = dataclasses.replace(cfg.train, init_from=str(init))
            cfg = dataclasses.replace(cfg, train=train_cfg)
        if dry_run:
            _dry_run(cfg, vocab_size or cfg.data.vocab_size)
            return
        display = TrainDisplay(err_console, quiet=verbosity.quiet, verbose=verbosity.verbose)
        try:
            result = run_training(
                cfg, TrainOptions(run_dir=run_dir, gpus=gpus, procs=procs), on_event=display
            )
        finally:
            display.close()
        if result.rank == 0 and not verbosity.quiet:
            err_console.print(summary_table(result))
        if result.stopped_by == "signal":  # not finished: no checkpoint path on stdout
            raise Interrupted(
                f"training stopped by signal {result.signal} at step {result.steps:,} after "
                "saving checkpoints/last.pt; rerun the same command to continue",
                result.signal or signal.SIGINT,
            )
        if result.rank == 0:
            typer.echo(str(result.last_checkpoint or result.run_dir / "checkpoints" / "last.pt"))


def _dry_run(cfg: RecipeConfig, size: int) -> None:
    from nmt_cli.engines.summary import summarize_model

    summary = summarize_model(cfg, size)
    table = Table(title=f"{cfg.name}: model summary (vocabulary {size:,}, shared)")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    for part, n in summary.parameters.items():
        table.add_row(part, f"{n:,}")
    err_console.print(table)
    settings = Table(title="settings")
    settings.add_column("setting")
    settings.add_column("value")
    for f in dataclasses.fields(summary.config):
        settings.add_row(f"model.{f.name}", str(getattr(summary.config, f.name)))
    for section in ("train", "decode"):
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            settings.add_row(f"{section}.{f.name}", str(getattr(obj, f.name)))
    err_console.print(settings)
    typer.echo(f"parameters: {summary.parameters['total']}")
