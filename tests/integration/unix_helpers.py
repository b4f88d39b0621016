"""What the Unix-behaviour tests share: running `nmt`, reading its one-line errors, and
a snapshot of a directory tree to prove that nothing outside the output changed."""

from __future__ import annotations

import gzip
import traceback
from pathlib import Path

from typer.testing import CliRunner, Result

from nmt_cli.cli import app
from nmt_cli.engines.prepare.demo_corpus import generate_pair
from tests.fixtures.files import snapshot as snapshot  # the tests import it from here too

runner = CliRunner()


def nmt(*args: str, stdin: bytes | str = b"", env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), input=stdin, env={"COLUMNS": "200", **(env or {})})


def no_escape(result: Result) -> None:
    """No exception escaped the command. CliRunner prints no traceback for one: it ends
    the run with exit code 1 and keeps the exception in `result.exception`, so that (not
    "Traceback" in the output) is what shows a bug; a clean exit is a `SystemExit`."""
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        shown = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else exc
        raise AssertionError(f"an exception escaped the command:\n{shown}")


def error_line(stderr: str) -> str:
    """The single `error:` line of a failed command's stderr, which must be its last."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    return errors[0]


def sole_error(stderr: str) -> str:
    """The `error:` line that is the whole of a failed command's stderr."""
    line = error_line(stderr)
    assert stderr.strip().splitlines() == [line], stderr
    return line


def one_error(result: Result, code: int, *fragments: str) -> str:
    """The `error:` line of a command a user made fail: exit `code`, no exception escaped,
    one `error:` line, last, holding every one of `fragments`."""
    assert result.exit_code == code, (result.exit_code, result.output)
    no_escape(result)
    line = error_line(result.stderr)
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def corpus_pairs(n: int, offset: int = 0) -> list[tuple[str, str]]:
    return [generate_pair(3, offset + i) for i in range(n)]


def write_lines(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path
