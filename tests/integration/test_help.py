"""Help that a person can read in an 80-column terminal: every line fits, every option's
help is one line (no sentence broken in two), flags are shown as flags, and `--nbest`
describes the lines it prints."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from nmt_cli.cli import app

runner = CliRunner()
COMMANDS = [
    [],
    ["prepare"],
    ["train"],
    ["translate"],
    ["average-checkpoints"],
    ["score"],
    ["run"],
    ["export"],
    ["import"],
    ["serve"],
    ["env"],
]
# typer's own option, whose text we do not write
THEIRS = ("--show-completion",)


def help_text(command: list[str]) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def option_entries(text: str) -> dict[str, list[str]]:
    """{option or argument line: the help lines that follow it} of the help's lists."""
    entries: dict[str, list[str]] = {}
    section, current = "", ""
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line
        elif section in ("Options:", "Arguments:") and line.strip():
            if re.match(r"^  \S", line):
                current = line
                entries[current] = []
            else:
                entries[current].append(line.strip())
    return entries


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["nmt", *c]))
def test_help_fits_80_columns_one_line_per_option(command: list[str]) -> None:
    text = help_text(command)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    wrapped = {}
    for entry, more in option_entries(text).items():
        help_on_same_line = bool(re.match(r"^  \S.*? {2,}\S", entry))
        if len(more) > (0 if help_on_same_line else 1) and not entry.strip().startswith(THEIRS):
            wrapped[entry.strip()] = more
    assert not wrapped, f"help wraps onto more lines: {wrapped}"


def test_flags_are_shown_as_flags() -> None:
    text = help_text(["translate"])
    assert "--json " in text and "<bool>" not in text
    assert "--paper / --no-paper" in help_text(["score"])


def test_nbest_help_matches_its_output_and_the_formula_is_printed() -> None:
    text = " ".join(help_text(["translate"]).split())
    assert "N ||| text ||| score ||| logprob" in text
    assert "lp(Y) = ((5 + |Y|) / 6) ** alpha" in text


def test_export_help_lists_every_quantization() -> None:
    from nmt_cli.engines.export.ctranslate2 import QUANTIZATIONS

    text = " ".join(help_text(["export"]).split())
    assert all(q in text for q in QUANTIZATIONS)
