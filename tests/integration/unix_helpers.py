"""What the Unix-behaviour tests share: running `nmt`, reading its one-line errors, and
a snapshot of a directory tree to prove that nothing outside the output changed."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from typer.testing import CliRunner, Result

from nmt_cli.cli import app
from nmt_cli.engines.prepare.demo_corpus import generate_pair

runner = CliRunner()


def nmt(*args: str, stdin: bytes | str = b"", env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), input=stdin, env={"COLUMNS": "200", **(env or {})})


def one_error(result: Result, code: int) -> str:
    """The single `error:` line of a failed command, which must be its last line."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


def snapshot(root: Path) -> dict[str, str]:
    """{relative path: kind and content digest} of every entry under `root`."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"link:{path.readlink()}"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "special"
    return out


def corpus_pairs(n: int, offset: int = 0) -> list[tuple[str, str]]:
    return [generate_pair(3, offset + i) for i in range(n)]


def write_lines(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path
