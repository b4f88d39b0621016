"""`nmt run`: prepare, train, average, translate and score one recipe, resumably."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
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
    warn,
)
from nmt_cli.errors import UsageError

if TYPE_CHECKING:  # the engine imports torch: only when the command runs
    from nmt_cli.engines.run import RunResult


def run(
    recipe: Path = typer.Argument(
        ..., metavar="RECIPE", help="Recipe TOML file, e.g. recipes/demo.toml."
    ),
    from_stage: str = typer.Option("prepare", "--from", help="First stage to run."),
    until: str = typer.Option("score", "--until", help="Last stage to run."),
    gpus: int = typer.Option(0, "--gpus", help="GPUs to train on; 0 = the CPU."),
    procs: int | None = typer.Option(
        None,
        "--procs",
        help="CPU processes (gloo); default: measured at start.",
    ),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Run a whole recipe, resumably: prepare to score.

    The stages: prepare -> train -> average -> translate -> score.

    Each stage whose output is already complete is skipped, so rerunning after any
    interruption continues where it stopped. Ends with a table in the shape of the
    paper's Table 2 and writes results.json into the run directory. Training stopped
    by Ctrl-C or SIGTERM exits with 130 or 143 and skips the later stages.
    """
    from nmt_cli.interrupts import stoppable_startup

    verbosity = Verbosity(quiet, verbose)
    # As `nmt train`'s: until training's first update a signal stops the command at once,
    # a main thread stuck in native code included (the guard's watchdog ends it).
    with user_errors(verbose), stoppable_startup(startup_printer(verbosity), exit_on_stall=True):
        from nmt_cli.commands.prepare_progress import StageProgress
        from nmt_cli.commands.train_display import TrainDisplay
        from nmt_cli.engines.run import RunHooks, RunOptions, StageNotice, run_recipe

        for flag, value in (("--gpus", gpus), ("--procs", procs or 0)):
            if value < 0:
                raise UsageError(f"{flag} must not be negative, got {value}")
        options = RunOptions(from_stage=from_stage, until_stage=until, gpus=gpus, procs=procs)
        cfg = recipe_from_cli(str(recipe), set_)
        display = TrainDisplay(err_console, quiet=verbosity.quiet)
        progress = StageProgress(err_console, enabled=not verbosity.quiet)

        def on_stage(notice: StageNotice) -> None:
            if verbosity.quiet:
                return
            # The prepare bars live only while prepare runs, so later output follows them.
            if notice.status == "start":
                err_console.rule(f"[bold]{notice.stage}")
                if notice.stage == "prepare":
                    progress.__enter__()
            elif notice.status == "done" and notice.stage == "prepare":
                progress.__exit__(None, None, None)
            if notice.status != "start" and notice.detail:
                detail = escape(notice.detail)
                err_console.print(f"[dim]{notice.stage}: {detail}[/]", highlight=False)

        hooks = RunHooks(stage=on_stage, prepare=progress, train=display)
        try:
            result = run_recipe(cfg, options, hooks)
        finally:
            display.close()
        if result.systems or result.parses:
            if not verbosity.quiet:
                err_console.print(results_table(result) if result.systems else parses_table(result))
            for text in result.warnings():
                warn(text)
            typer.echo(f"{result.run_dir}/results.json")


def results_table(result: RunResult) -> Table:
    from nmt_cli.commands.train_display import duration

    """The paper's Table 2 shape: one row per system, both BLEU flavours side by side."""
    pair = f"{result.src.upper()}-{result.tgt.upper()}"
    table = Table(title=f"{result.recipe}: {pair} test set", caption=_caption(result))
    columns = ("model", "sacreBLEU", "BLEU (tokenized)", "chrF2", "steps", "time", "params")
    for column in (*columns, "FLOPs"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for s in result.systems:
        table.add_row(
            s.system,
            f"{s.bleu:.1f}",
            f"{s.paper_bleu:.1f}" if s.paper_bleu is not None else "-",
            f"{s.chrf:.1f}",
            f"{result.steps:,}",
            duration(result.train_seconds),
            f"{result.parameters / 1e6:.1f}M",
            f"{result.train_flops:.1e}",
        )
    return table


def parses_table(result: RunResult) -> Table:
    """The paper's Table 4 shape for a parsing recipe: EVALB's F1 per system."""
    from nmt_cli.commands.train_display import duration

    first = result.parses[0]
    table = Table(
        title=f"{result.recipe}: parsing, test set (EVALB, COLLINS.prm)",
        caption=f"signature: {first.signature}\nF1 <= {first.cutoff_len}: sentences of at "
        f"most {first.cutoff_len} words; repaired: outputs that were not well-formed trees",
    )
    columns = ("model", "F1", f"F1 <= {first.cutoff_len}", "recall", "precision")
    for column in (*columns, "exact", "repaired", "steps", "time", "params"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for p in result.parses:
        table.add_row(
            p.system,
            f"{p.f1:.2f}",
            f"{p.f1_short:.2f}",
            f"{p.recall:.2f}",
            f"{p.precision:.2f}",
            f"{p.complete_match:.1f}",
            f"{p.repaired:,} / {p.lines:,}",
            f"{result.steps:,}",
            duration(result.train_seconds),
            f"{result.parameters / 1e6:.1f}M",
        )
    return table


def _caption(result: RunResult) -> str:
    first = result.systems[0]
    lines = [f"sacreBLEU: {first.bleu_signature}"]
    if first.paper_bleu_signature:
        lines.append(f"tokenized (the paper's way, not comparable): {first.paper_bleu_signature}")
    lines.append(
        "FLOPs: matrix products of every update, forward + backward, counted; the paper's "
        f"Table 2 way (time x devices x measured matmul rate): {result.device_flops:.1e}"
    )
    return "\n".join(lines)
