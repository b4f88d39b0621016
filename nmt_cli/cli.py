"""The `nmt` command: one Typer app, one thin command per engine.

Start-up stays light: the command modules import their engines (and with them torch)
only when they run, so `nmt --help`, `nmt score` and `nmt prepare --list` answer
without loading PyTorch. Click's own usage errors (a missing argument, an unknown
option, a value that is not a number) are printed as one `error:` line with exit code 2,
like every other error of the toolkit.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer._click import exceptions as click_errors  # Typer's own copy of click
from typer.core import TyperGroup

from nmt_cli import __version__
from nmt_cli.commands.attention import attention
from nmt_cli.commands.average import average_checkpoints
from nmt_cli.commands.common import fail
from nmt_cli.commands.env import env
from nmt_cli.commands.export import export
from nmt_cli.commands.import_ import import_command
from nmt_cli.commands.plot import plot
from nmt_cli.commands.prepare import prepare_command
from nmt_cli.commands.run import run
from nmt_cli.commands.score import score
from nmt_cli.commands.serve import serve
from nmt_cli.commands.sweep import sweep
from nmt_cli.commands.train import train
from nmt_cli.commands.translate import translate


class NmtGroup(TyperGroup):
    """The root command: Typer's group, with click's errors turned into one line."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(
                args=args,
                prog_name=prog_name or "nmt",
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except click_errors.NoArgsIsHelpError as exc:  # `nmt` alone: the help, exit 2
            exc.show()
            code = exc.exit_code
        except click_errors.UsageError as exc:
            code = _usage_error(exc)
        except click_errors.ClickException as exc:
            code = _exit(fail(exc.format_message(), exc.exit_code))
        except typer.Abort:
            code = _exit(fail("interrupted", 130))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def _exit(exc: typer.Exit) -> int:
    return int(exc.exit_code)


def _usage_error(exc: click_errors.UsageError) -> int:
    """`error: <what>; see 'nmt train --help'` on one line, exit code 2."""
    message = exc.format_message().rstrip(".")
    hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
    return _exit(fail(f"{message}{hint}", exc.exit_code))


app = typer.Typer(
    name="nmt",
    cls=NmtGroup,
    help=(
        "Neural machine translation with the Transformer of 'Attention Is All You Need'.\n\n"
        "prepare -> train -> average-checkpoints -> translate -> score, each driven by a "
        "TOML recipe (see recipes/); serve answers over HTTP; export hands a checkpoint to "
        "CTranslate2 or transformers, import brings MarianMT and fairseq models in "
        "(then train --init fine-tunes them). Exit codes: 0 success, 1 failure, 2 usage error, "
        "130/143 stopped by Ctrl-C/SIGTERM (after saving)."
    ),
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
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
app.command("import")(import_command)
app.command("run")(run)
app.command("sweep")(sweep)
app.command("attention")(attention)
app.command("plot")(plot)
app.command("serve")(serve)
app.command("env")(env)


def main() -> None:
    app()
