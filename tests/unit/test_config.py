"""Recipes: strict loading, suggestions, includes, overrides, and every shipped recipe."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nmt_cli.config import ConfigError, RecipeConfig, load_recipe, recipe_from_dict

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_papers_base() -> None:
    cfg = RecipeConfig()
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads) == (512, 2048, 8)
    assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup_steps == 4000
    assert (cfg.decode.beam_size, cfg.decode.length_penalty, cfg.decode.max_len_b) == (4, 0.6, 50)


def test_unknown_key_names_its_path_and_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.toml", "[model]\nd_modle = 256\n")
    with pytest.raises(
        ConfigError, match=r"unknown key model\.d_modle; did you mean model\.d_model"
    ):
        load_recipe(path)


def test_unknown_section_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.toml", "[trian]\nmax_steps = 3\n")
    with pytest.raises(ConfigError, match="did you mean train"):
        load_recipe(path)


def test_wrong_type_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.toml", '[model]\nd_model = "big"\n')
    with pytest.raises(ConfigError, match="model.d_model must be an integer"):
        load_recipe(path)
    path = _write(tmp_path / "r.toml", '[model]\npositions = "rotary"\n')
    with pytest.raises(ConfigError, match="model.positions must be one of"):
        load_recipe(path)


def test_invariants_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.toml", "[model]\nd_model = 100\nn_heads = 8\n")
    with pytest.raises(ConfigError, match="must divide model.d_model"):
        load_recipe(path)


def test_ints_are_accepted_as_floats(tmp_path: Path) -> None:
    cfg = load_recipe(_write(tmp_path / "r.toml", "[train]\nlr_scale = 2\n"))
    assert cfg.train.lr_scale == 2.0 and isinstance(cfg.train.lr_scale, float)


def test_include_and_override(tmp_path: Path) -> None:
    _write(tmp_path / "parent.toml", 'name = "p"\n[model]\nd_model = 256\nd_ff = 1024\n')
    path = _write(tmp_path / "child.toml", 'include = "parent.toml"\n[model]\nd_ff = 512\n')
    cfg = load_recipe(path, ["model.n_heads=4", "train.run_dir=runs/x", "decode.beam_size=5"])
    assert (cfg.name, cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads) == ("p", 256, 512, 4)
    assert cfg.train.run_dir == "runs/x"
    assert cfg.decode.beam_size == 5


def test_include_cycle_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path / "a.toml", 'include = "b.toml"\n')
    _write(tmp_path / "b.toml", 'include = "a.toml"\n')
    with pytest.raises(ConfigError, match="include cycle"):
        load_recipe(tmp_path / "a.toml")


def test_bad_override_and_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.toml", "")
    with pytest.raises(ConfigError, match="section.key=value"):
        load_recipe(path, ["nonsense"])
    with pytest.raises(ConfigError, match="unknown key model.dmodel"):
        load_recipe(path, ["model.dmodel=3"])
    with pytest.raises(ConfigError, match="no such recipe"):
        load_recipe(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(_write(tmp_path / "bad.toml", "[model\n"))


def test_round_trip_through_dict() -> None:
    cfg = RecipeConfig()
    assert recipe_from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(recipe: Path) -> None:
    """Each value a recipe writes itself is the loaded one (over its includes' values),
    its own name included, read here with tomllib."""
    cfg = load_recipe(recipe).to_dict()
    written = tomllib.loads(recipe.read_text(encoding="utf-8"))
    assert written.pop("name") == cfg["name"] != RecipeConfig().name
    written.pop("include", None)
    for key, value in written.items():
        if isinstance(value, dict):
            assert {k: cfg[key][k] for k in value} == value, key
        else:
            assert cfg[key] == value, key
