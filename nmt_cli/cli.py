"""The `nmt` command: one Typer app, one thin command per engine."""

from __future__ import annotations

import typer

from nmt_cli import __version__
from nmt_cli.commands.average import average_checkpoints
from nmt_cli.commands.export import export
from nmt_cli.commands.prepare import prepare_command
from nmt_cli.commands.run import run
from nmt_cli.commands.score import score
from nmt_cli.commands.train import train
from nmt_cli.commands.translate import translate

app = typer.Typer(
    name="nmt",
    help=(
        "Neural machine translation with the Transformer of 'Attention Is All You Need'.\n\n"
        "prepare -> train -> average-checkpoints -> translate -> score, each driven by a "
        "TOML recipe (see recipes/); export serves a checkpoint through CTranslate2 or "
        "transformers. Exit codes: 0 success, 1 failure, 2 usage error."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Neural machine translation with the Transformer."""


app.command("prepare")(prepare_command)
app.command("train")(train)
app.command("translate")(translate)
app.command("average-checkpoints")(average_checkpoints)
app.command("score")(score)
app.command("export")(export)
app.command("run")(run)


def main() -> None:
    app()
