"""What every command shares: the consoles and the translation of user errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from nmt_cli.config import RecipeConfig, load_recipe
from nmt_cli.errors import NmtError

# Progress, tables and messages go to stderr so that stdout carries only results
# (translations, scores) and can be piped.
err_console = Console(stderr=True)
out_console = Console()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn an NmtError into `error: ...` on stderr and exit code 1, without a traceback."""
    try:
        yield
    except NmtError as exc:
        # Escaped: a message may quote brackets (a path, "pip install 'nmt-cli[export]'").
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


def recipe_from_cli(path: str, overrides: list[str] | None) -> RecipeConfig:
    return load_recipe(path, overrides or [])


SET_HELP = "Override a recipe setting, e.g. --set model.d_model=256 (repeatable)."
