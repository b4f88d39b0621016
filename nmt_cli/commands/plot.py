"""`nmt plot`: training curves of one or more runs, overlaid."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.common import Verbosity, info, quiet_option, user_errors, verbose_option
from nmt_cli.engines.pictures.backend import IMAGE_FORMATS
from nmt_cli.errors import NmtError


def plot(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories (train.run_dir)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Directory for the pictures (default: the run directory "
        "when there is one run, ./plots for several).",
    ),
    formats: str = typer.Option(
        ",".join(IMAGE_FORMATS), "--format", help="Comma-separated: png, svg."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Draw the training curves of one or more runs, overlaid.

    Training loss, dev loss and perplexity, dev BLEU, learning rate, tokens/s and gradient
    norm, from each run's metrics.jsonl, against steps (curves-steps) and against training
    time (curves-time).
    """
    from nmt_cli.engines.pictures.curves import write_curves
    from nmt_cli.engines.training_log import read_run_log

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        chosen = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
        if not chosen or any(f not in IMAGE_FORMATS for f in chosen):
            raise NmtError(f"--format {formats}: use png, svg or both")
        runs = [read_run_log(d) for d in run_dirs]
        if not any(run.records for run in runs):
            raise NmtError(f"{', '.join(map(str, run_dirs))}: metrics.jsonl has no records yet")
        target = out or (run_dirs[0] if len(run_dirs) == 1 else Path("plots"))
        written = write_curves(runs, target, chosen)
        info(f"wrote {len(written)} files to {target}", verbosity)
        for path in written:
            typer.echo(path)
