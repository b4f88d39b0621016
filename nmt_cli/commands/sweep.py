"""`nmt sweep`: run the rows of a sweep file (e.g. the paper's Table 3) and print the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from nmt_cli.commands.common import (
    SET_HELP,
    Verbosity,
    err_console,
    fail,
    info,
    quiet_option,
    user_errors,
    verbose_option,
)

if TYPE_CHECKING:  # the engine (and torch) load when the command runs
    from nmt_cli.engines.sweep import RowResult, SweepResult


def sweep(
    sweep_file: Path = typer.Argument(
        ..., help="Sweep file, e.g. recipes/sweeps/table3-multi30k.toml."
    ),
    jobs: int = typer.Option(0, "--jobs", help="Rows at once; 0 = one per GPU or CPU core."),
    gpus: int = typer.Option(0, "--gpus", help="GPUs to spread the rows over; 0 = the CPU."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP + " Every row."),
    table_only: bool = typer.Option(
        False, "--table", help="Print the table of the rows done so far; run nothing."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Run every row of a sweep as its own `nmt run`, then print a Table 3.

    Rows already complete are skipped and interrupted rows resume, so rerunning the
    same command carries on. The table is also written to RUNS_DIR/sweep.json.
    """
    from nmt_cli.engines.sweep import (
        SweepOptions,
        collect_sweep,
        load_sweep,
        run_sweep,
        with_overrides,
    )

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        plan = load_sweep(sweep_file)
        if table_only:
            err_console.print(sweep_table(collect_sweep(with_overrides(plan, tuple(set_)))))
            return
        options = SweepOptions(jobs=jobs, gpus=gpus, extra_overrides=tuple(set_))
        info(f"nmt sweep: {len(plan.rows)} rows of {plan.recipe} into {plan.runs_dir}", verbosity)

        def notify(name: str, row: RowResult) -> None:
            info(f"  {name}: {row.status}", verbosity)

        result = run_sweep(plan, options, notify)
        err_console.print(sweep_table(result))
        typer.echo(f"{plan.runs_dir}/sweep.json")
        failed = [r.name for r in result.rows if r.status.startswith("failed")]
        if failed:
            raise fail(f"rows failed: {', '.join(failed)}")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _params(count: int) -> str:
    if not count:
        return "-"
    return f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count:,}"


def sweep_table(result: SweepResult) -> Table:
    """The paper's Table 3 columns, one row per variant; for a parsing recipe, the
    settings section 6.3 chose on the dev trees (beam, alpha) and F1 for BLEU."""
    trees = any(r.metric == "trees" for r in result.rows)
    metric = "F1" if trees else "BLEU"
    scored = (
        "F1 = EVALB (COLLINS.prm) labelled bracket F1 of the last checkpoint's trees"
        if trees
        else "BLEU = sacreBLEU of the last checkpoint"
    )
    table = Table(
        title=f"{result.plan.source.name}: variations on {result.plan.recipe.name}",
        caption=(
            f"dev PPL per subword token at the last validation; {scored}, beam search, no "
            "averaging (as Table 3); FLOPs counted, forward + backward"
        ),
    )
    columns = ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "pos"]
    columns += ["beam", "alpha"] if trees else []
    columns += ["steps", "params", "dev PPL", f"dev {metric}", f"test {metric}", "FLOPs"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("row", "pos") else "right")
    for r in result.rows:
        layers = str(r.encoder_layers)
        if r.decoder_layers != r.encoder_layers:
            layers += f"+{r.decoder_layers}"
        decoding = [str(r.beam), f"{r.length_penalty:g}"] if trees else []
        dev, test = (r.dev_f1, r.test_f1) if trees else (r.dev_bleu, r.test_bleu)
        table.add_row(
            r.name,
            layers,
            str(r.d_model),
            str(r.d_ff),
            str(r.n_heads),
            str(r.d_k),
            str(r.d_v),
            f"{r.dropout:g}",
            f"{r.label_smoothing:g}",
            r.positions[:3],
            *decoding,
            f"{r.steps:,}" if r.steps else "-",
            _params(r.parameters),
            _num(r.dev_ppl, ".2f"),
            _num(dev, ".1f"),
            _num(test, ".1f"),
            f"{r.train_flops:.1e}" if r.train_flops else "-",
        )
    return table
