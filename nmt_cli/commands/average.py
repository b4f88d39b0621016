"""`nmt average-checkpoints`: the mean of checkpoints, as the paper's final models."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.common import err_console, user_errors
from nmt_cli.engines.average import average_checkpoints as average_engine
from nmt_cli.engines.average import select_last
from nmt_cli.errors import NmtError


def average_checkpoints(
    inputs: list[Path] = typer.Argument(
        ..., help="Checkpoints to average, or one run directory with --last N."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Averaged checkpoint to write."),
    last: int | None = typer.Option(
        None, "--last", help="Average the newest N step checkpoints of the run directory."
    ),
) -> None:
    """Average checkpoints (the paper: the last 5 for base models, the last 20 for big).

    Weights are averaged in float64 one checkpoint at a time; the output is an inference
    checkpoint (no optimizer state) that `nmt translate` loads. Checkpoints of different
    architectures or vocabularies are refused.
    """
    with user_errors():
        if last is not None:
            if len(inputs) != 1 or not inputs[0].is_dir():
                raise NmtError("--last N takes exactly one run directory")
            paths = select_last(inputs[0], last)
            if len(paths) < last:
                err_console.print(
                    f"[yellow]warning:[/] {inputs[0]} has only {len(paths)} step "
                    f"checkpoint(s); averaging those instead of {last}",
                    soft_wrap=True,
                )
        else:
            if any(p.is_dir() for p in inputs):
                raise NmtError("a run directory needs --last N (e.g. --last 5)")
            paths = inputs
        result = average_engine(paths, output)
        steps = ", ".join(map(str, result.steps))
        err_console.print(
            f"averaged {len(result.inputs)} checkpoint(s) (steps {steps}; "
            f"{result.parameters:,} values) -> {result.output}",
            highlight=False,
            soft_wrap=True,
        )
        typer.echo(str(result.output))
