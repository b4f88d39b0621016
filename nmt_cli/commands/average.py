"""`nmt average-checkpoints`: the mean of checkpoints, as the paper's final models."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.common import (
    Verbosity,
    info,
    quiet_option,
    user_errors,
    verbose_option,
    warn,
)
from nmt_cli.errors import NmtError, UsageError
from nmt_cli.outputs import check_output_path


def average_checkpoints(
    inputs: list[Path] = typer.Argument(
        ..., metavar="CHECKPOINT", help="Checkpoints, or a run dir with --last."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Averaged checkpoint to write."),
    last: int | None = typer.Option(
        None, "--last", help="Average the newest N step checkpoints of a run."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Average checkpoints, as the paper's final models.

    The paper averages the last 5 checkpoints of base models, the last 20 of big ones.

    Weights are averaged in float64 one checkpoint at a time; the output is an inference
    checkpoint (no optimizer state) that `nmt translate` loads. Checkpoints of different
    architectures or vocabularies are refused.
    """
    from nmt_cli.engines.average import average_checkpoints as average_engine
    from nmt_cli.engines.average import select_last

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        if last is not None:
            if last < 1:
                raise UsageError(f"--last must be at least 1, got {last}")
            if len(inputs) != 1:
                raise UsageError("--last N takes exactly one run directory")
            if not inputs[0].exists():
                raise NmtError(f"{inputs[0]}: no such run directory")
            if not inputs[0].is_dir():
                raise NmtError(f"{inputs[0]}: --last N takes a run directory, not a file")
            paths = select_last(inputs[0], last)
            if len(paths) < last:
                warn(
                    f"{inputs[0]} has only {len(paths)} step checkpoint(s); "
                    f"averaging those instead of {last}"
                )
        else:
            if any(p.is_dir() for p in inputs):
                raise UsageError("a run directory needs --last N (e.g. --last 5)")
            paths = inputs
        check_output_path(output, inputs=paths)
        result = average_engine(paths, output)
        steps = ", ".join(map(str, result.steps))
        info(
            f"averaged {len(result.inputs)} checkpoint(s) (steps {steps}; "
            f"{result.parameters:,} values) -> {result.output}",
            verbosity,
        )
        typer.echo(str(result.output))
