"""What every command shares: the consoles, --quiet/--verbose, and the translation of
errors into one `error:` line and an exit code.

Results go to stdout and everything else (progress, summaries, warnings, errors) to
stderr, so a command's output can be piped. A mistake the user can fix is an `NmtError`
and exits with its code (1, or 2 for a bad option value). An operating-system failure
(disk full, permission denied) is reported the same way. Anything else is a bug: it too
gets one line, with the traceback only under --verbose, so a user never has to read one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from nmt_cli.errors import NmtError

if TYPE_CHECKING:  # the recipe module is light, but keep start-up to what a command needs
    from nmt_cli.config import RecipeConfig

# Progress, tables and messages go to stderr so that stdout carries only results
# (translations, scores) and can be piped.
err_console = Console(stderr=True)
out_console = Console()

SET_HELP = "A recipe setting, e.g. model.d_model=256; repeatable."


def quiet_option() -> Any:
    return typer.Option(False, "--quiet", "-q", help="Only warnings and errors on stderr.")


def on_bad_utf8_option() -> Any:
    return typer.Option(
        "error",
        "--on-bad-utf8",
        help="Non-text bytes: error (default) or replace.",
        show_default=False,
    )


def verbose_option() -> Any:
    return typer.Option(False, "--verbose", "-v", help="More detail; tracebacks of bugs.")


@dataclass(frozen=True)
class Verbosity:
    """What a command may print on stderr besides warnings and errors."""

    quiet: bool = False
    verbose: bool = False

    @property
    def progress(self) -> bool:
        """Live progress only for a person watching: not under --quiet, not into a file."""
        return not self.quiet and err_console.is_terminal


def warn(text: str) -> None:
    """One `warning:` line on stderr (shown even under --quiet)."""
    err_console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)


def info(text: str, verbosity: Verbosity) -> None:
    """A line of information on stderr, unless --quiet."""
    if not verbosity.quiet:
        err_console.print(escape(text), highlight=False, soft_wrap=True)


def fail(text: str, code: int = 1) -> typer.Exit:
    """Print `error: text` on stderr; return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def user_errors(verbose: bool = False) -> Iterator[None]:
    """Turn every failure into `error: ...` on stderr and a meaningful exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except NmtError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except KeyboardInterrupt:
        # Stopping (decoding workers, open files) may take a moment: a second Ctrl-C
        # then would break out of the clean-up with a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise fail("interrupted", 130) from None
    except BrokenPipeError:
        # The reader of stdout left (`nmt translate ... | head`): it has what it wanted,
        # so stop quietly and successfully; stdout goes to /dev/null so that the final
        # flush at exit does not fail a second time.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except MemoryError:
        raise fail("out of memory; use smaller batches or a smaller model") from None
    except OSError as exc:
        if verbose:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        raise fail(f"{where}{exc.strerror or exc}") from None
    except Exception as exc:
        if verbose or os.environ.get("NMT_TRACEBACK"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise fail(
            f"internal error ({type(exc).__name__}{': ' + first if first else ''}); "
            "this is a bug in nmt: please report it with the output of --verbose"
        ) from None


def recipe_from_cli(path: str, overrides: list[str] | None) -> RecipeConfig:
    from nmt_cli.config import load_recipe

    return load_recipe(path, overrides or [])


def startup_printer(verbosity: Verbosity) -> Callable[[str], None] | None:
    """--verbose: a line as training's start-up enters each phase (rank 0's, under
    torchrun), for the guard of `nmt train` and `nmt run` (nmt_cli/interrupts.py)."""
    if not verbosity.verbose or os.environ.get("RANK", "0") != "0":
        return None
    return lambda phase: info(f"start-up: {phase}", verbosity)
