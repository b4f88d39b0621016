"""`nmt train`: train a recipe's model (or, with --dry-run, build and describe it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer
from rich.table import Table

from nmt_cli.commands.common import SET_HELP, err_console, recipe_from_cli, user_errors
from nmt_cli.engines.summary import summarize_model
from nmt_cli.errors import NmtError


def train(
    recipe: Path = typer.Argument(..., help="Recipe TOML file, e.g. recipes/base.toml."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Build the model and print a summary; touch no data."
    ),
    vocab_size: int | None = typer.Option(
        None, "--vocab-size", help="Vocabulary size for --dry-run without a data directory."
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Train the recipe's model on its prepared data directory."""
    with user_errors():
        cfg = recipe_from_cli(str(recipe), set_)
        if not dry_run:
            raise NmtError("training arrives with the training engine; use --dry-run for now")
        size = vocab_size or cfg.data.vocab_size
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
