"""The `nmt` command frame: help, version, exit codes, dry run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli import __version__
from nmt_cli.cli import app

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()


def test_help_explains_the_toolkit() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Attention Is All You Need" in " ".join(result.output.split())
    assert "train" in result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"nmt {__version__}"


def test_usage_error_exits_2() -> None:
    one_error(runner.invoke(app, ["train"]), 2, "Missing argument", "see 'nmt train --help'")
    one_error(runner.invoke(app, ["no-such-command"]), 2, "No such command 'no-such-command'")


@pytest.mark.parametrize(
    ("recipe", "expected"), [("base.toml", 64_618_496), ("big.toml", 217_317_376)]
)
def test_dry_run_prints_parameter_counts(recipe: str, expected: int) -> None:
    result = runner.invoke(
        app, ["train", str(RECIPES / recipe), "--dry-run", "--vocab-size", "40000"]
    )
    assert result.exit_code == 0, result.output
    assert f"parameters: {expected}" in result.stdout
    assert "encoder" in result.output and "decoder" in result.output


def test_dry_run_with_override() -> None:
    """The setting takes: the recipe's table shows it, and the count loses exactly five
    of base's six encoder layers, each counted from the core's own layer."""
    from nmt_cli.config import load_recipe
    from nmt_cli.core.operations import REFERENCE
    from nmt_cli.core.parameters import count_parameters
    from nmt_cli.core.transformer import EncoderLayer

    args = ["train", str(RECIPES / "base.toml"), "--dry-run", "--vocab-size", "1000"]

    def parameters(*extra: str) -> tuple[int, str]:
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        line = next(x for x in result.stdout.splitlines() if x.startswith("parameters: "))
        return int(line.removeprefix("parameters: ")), result.output

    full, _ = parameters()
    one, shown = parameters("--set", "model.encoder_layers=1")
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in shown.splitlines()]
    assert ["model.encoder_layers", "1"] in rows  # the resolved recipe, as printed
    layer = EncoderLayer(load_recipe(str(RECIPES / "base.toml"), []).model, REFERENCE)
    assert full - one == 5 * count_parameters(layer)


def test_user_mistake_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nd_modle = 3\n")
    result = runner.invoke(app, ["train", str(bad), "--dry-run"])
    one_error(result, 1, "did you mean model.d_model")


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.name)
def test_every_recipe_builds_its_model(recipe: Path) -> None:
    result = runner.invoke(app, ["train", str(recipe), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert int(result.stdout.split("parameters:")[1].split()[0]) > 1_000_000
