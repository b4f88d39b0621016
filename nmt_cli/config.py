"""Recipes: one TOML file describes a whole experiment (data, model, training, decoding).

Each section is a frozen dataclass. The loader is strict: an unknown key is an error that
names its dotted path and suggests the nearest valid key, and every value is checked
against its annotation. A recipe may `include = "other.toml"` (paths relative to the
including file) and override what it includes; the command line overrides both with
`--set section.key=value`, the value read as TOML (bare words are taken as strings).
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nmt_cli.core.transformer import ModelConfig
from nmt_cli.errors import NmtError

Precision = Literal["auto", "fp32", "bf16", "fp16"]


class ConfigError(NmtError):
    """A recipe or override that names an unknown key or holds a value of the wrong type."""


@dataclass(frozen=True)
class DataConfig:
    """Where the corpus comes from and how `nmt prepare` turns it into a data directory."""

    preset: str = ""  # a named corpus ("demo", "wmt14-en-de", ...); empty with source_dir
    source_dir: str = ""  # local parallel text: train/valid/test files per language
    src: str = "en"
    tgt: str = "de"
    dir: str = "data/demo"  # the prepared data directory that training reads
    vocab_size: int = 8000
    joint_vocab: bool = True
    max_len: int = 250  # tokens per side; longer pairs are dropped at prepare
    max_len_ratio: float = 1.5
    dedup: bool = False
    normalize_punctuation: bool = False
    max_pairs: int = 0  # 0 = all
    test_split: str = ""  # which test file when a directory has several
    seed: int = 1
    valid_split: str = ""  # which dev file when a directory has several
    sample_max_pairs: bool = False  # max_pairs takes a seeded sample, not the first pairs
    on_bad_utf8: str = "error"  # or "replace": go on and count the damaged lines
    cache_dir: str = ""  # the datasets cache for presets; empty = the library's default

    def __post_init__(self) -> None:
        if self.on_bad_utf8 not in ("error", "replace"):
            raise ValueError(
                f"data.on_bad_utf8 must be 'error' or 'replace', got {self.on_bad_utf8!r}"
            )
        if self.vocab_size < 8:
            raise ValueError(f"data.vocab_size must be at least 8, got {self.vocab_size}")
        if self.max_len_ratio < 1.0:
            raise ValueError(f"data.max_len_ratio must be >= 1, got {self.max_len_ratio}")


@dataclass(frozen=True)
class TrainConfig:
    """The training procedure of section 5; defaults are the paper's base model."""

    run_dir: str = "runs/demo"
    # The update's size in real tokens (no padding) of its larger side, as the paper counts
    # "approximately 25000 source tokens and 25000 target tokens" (section 5.1).
    batch_tokens: int = 25000
    # Memory cap: padded tokens (sentences x longest side) per device and forward pass;
    # 0 = the device's whole share of the update in one pass.
    max_tokens: int = 0
    label_smoothing: float = 0.1
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # multiplies equation (3); 1.0 is the paper
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    clip_norm: float = 0.0  # 0 = no clipping (the paper does not clip)
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_time_minutes: float = 0.0  # 0 = no limit
    save_interval_minutes: float = 10.0
    save_interval_steps: int = 0  # 0 = by time only
    keep_last: int = 20
    precision: Precision = "auto"
    seed: int = 1
    log_interval_steps: int = 50
    validate_bleu_sentences: int = 0  # greedy BLEU on the first M dev sentences; 0 = off
    # TensorBoard logs (scalars, attention images) into <run>/tensorboard: "auto" when
    # tensorboard is installed, true to be warned when it is not, false never.
    tensorboard: bool | Literal["auto"] = "auto"
    threads: int = 0  # 0 = all cores

    def __post_init__(self) -> None:
        if self.batch_tokens < 1:
            raise ValueError(f"train.batch_tokens must be positive, got {self.batch_tokens}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup_steps < 1:
            raise ValueError(f"train.warmup_steps must be at least 1, got {self.warmup_steps}")
        if self.keep_last < 1:
            raise ValueError(f"train.keep_last must be at least 1, got {self.keep_last}")


@dataclass(frozen=True)
class DecodeConfig:
    """Section 6.1: beam 4, length penalty alpha 0.6, maximum length input + 50."""

    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT: lp(Y) = ((5 + |Y|) / 6)^alpha
    max_len_a: float = 1.0  # maximum output length = a * source length + b
    max_len_b: int = 50
    batch_sentences: int = 128
    batch_tokens: int = 0  # 0 = limit by sentences only
    precision: Precision = "auto"
    average_last: int = 5  # checkpoints averaged for the final model (base 5, big 20)
    nbest: int = 1  # hypotheses kept per sentence (at most beam_size)
    device: str = "auto"  # "cpu", "cuda", "cuda:1", ...; auto = cuda if available
    threads: int = 0  # CPU threads; 0 = all cores available to the process
    workers: int = 0  # CPU batches decoded side by side; 0 = one per thread
    buffer_lines: int = 2000  # read-ahead: lines sorted by length together, memory bound

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"decode.beam_size must be at least 1, got {self.beam_size}")
        if not 1 <= self.nbest <= self.beam_size:
            raise ValueError(
                f"decode.nbest must be between 1 and the beam size ({self.beam_size}), "
                f"got {self.nbest}"
            )
        if self.batch_sentences < 1 or self.batch_tokens < 0 or self.buffer_lines < 1:
            raise ValueError(
                "decode.batch_sentences and decode.buffer_lines must be at least 1 and "
                "decode.batch_tokens at least 0"
            )
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ValueError("decode.max_len_a and decode.max_len_b must not be negative")
        if self.average_last < 1:
            raise ValueError(f"decode.average_last must be at least 1, got {self.average_last}")


@dataclass(frozen=True)
class ScoreConfig:
    """Which BLEU flavours `nmt run` reports; both by default, always labelled.

    sacreBLEU scores detokenized output against raw references (comparable across papers);
    the paper's figure is tokenized BLEU with hyphenated compounds split (section 6.1).
    """

    sacrebleu: bool = True
    paper_bleu: bool = True
    chrf: bool = True


@dataclass(frozen=True)
class RecipeConfig:
    name: str = "recipe"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> RecipeConfig:
    """Read a recipe file, apply its includes and the `--set` overrides, and validate."""
    raw = _read_with_includes(Path(path), seen=())
    for item in overrides or []:
        apply_override(raw, item)
    return recipe_from_dict(raw, source=str(path))


def recipe_from_dict(raw: dict[str, Any], source: str = "recipe") -> RecipeConfig:
    try:
        return _build(RecipeConfig, raw, prefix="", source=source)
    except ValueError as exc:  # a __post_init__ invariant
        raise ConfigError(f"{source}: {exc}") from None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """`section.key=value`: the value is parsed as TOML, or kept as a bare string."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _read_with_includes(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path.name}: include cycle through {', '.join(p.name for p in seen)}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such recipe file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    merged: dict[str, Any] = {}
    for inc in includes:
        _deep_merge(merged, _read_with_includes(path.parent / inc, (*seen, path)))
    _deep_merge(merged, raw)
    return merged


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def _build(cls: type[Any], raw: Any, prefix: str, source: str) -> Any:
    where = prefix.rstrip(".") or "the recipe"
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where} must be a table of settings")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: unknown key {prefix}{key}{hint} (valid: {valid})")
        hint_type = hints[key]
        if isinstance(hint_type, type) and dataclasses.is_dataclass(hint_type):
            kwargs[key] = _build(hint_type, value, f"{prefix}{key}.", source)
        else:
            kwargs[key] = _check_value(value, hint_type, f"{prefix}{key}", source)
    return cls(**kwargs)


def _check_value(value: Any, hint: Any, key: str, source: str) -> Any:
    """Return `value` if it fits `hint` (ints are accepted where floats are expected)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value in allowed:
            return value
        raise ConfigError(f"{source}: {key} must be one of {', '.join(map(repr, allowed))}")
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option is type(None) and value is None:
                return None
            try:
                return _check_value(value, option, key, source)
            except ConfigError:
                continue
        raise ConfigError(f"{source}: {key} has the wrong type ({type(value).__name__})")
    expected = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be an integer, got {value!r}")
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ConfigError(f"{source}: {key} must be {expected.get(hint, str(hint))}, got {value!r}")
