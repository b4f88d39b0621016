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

from nmt_cli.backends.pytorch import ATTENTION_BACKENDS, AttentionBackend
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.precision import (
    DECODE_PRECISIONS,
    DecodePrecision,  # noqa: F401 - imported from here by commands/translate.py
    DecodePrecisionSetting,
    PrecisionSetting,
)
from nmt_cli.core.settings import SettingError, above, at_least, below, fraction, one_of
from nmt_cli.errors import NmtError
from nmt_cli.trees.linearize import LEAVES


class ConfigError(NmtError):
    """A recipe or override that names an unknown key or holds a value of the wrong type."""


class OverrideError(ConfigError):
    """The bad key or value came from a `--set` on the command line: a usage error."""

    exit_code = 2


def _config_error(where: str, message: str) -> ConfigError:
    """`where: message`, as a usage error when `where` is a --set."""
    cls = OverrideError if where.startswith("--set") else ConfigError
    return cls(f"{where}: {message}")


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
    cache_dir: str = ""  # download cache of presets; empty = ~/.cache (datasets: its own)
    # A treebank's targets (nmt_cli/trees/linearize.py): "xx", the paper's XX at every
    # word, or "words", the word itself; the data directory's manifest decides at training.
    tree_leaves: str = "xx"

    def __post_init__(self) -> None:
        one_of("data", self, "on_bad_utf8", ("error", "replace"))
        one_of("data", self, "tree_leaves", LEAVES)
        at_least("data", self, 8, "vocab_size")
        at_least("data", self, 0, "max_len", "max_pairs", "seed")
        below("data", self, 2**32, "seed")  # numpy's and SentencePiece's seed range
        if self.max_len_ratio != 0:  # 0 = no ratio filter, as `nmt prepare --max-len-ratio 0`
            at_least("data", self, 1, "max_len_ratio")


@dataclass(frozen=True)
class TrainConfig:
    """The training procedure of section 5; defaults are the paper's base model."""

    run_dir: str = "runs/demo"
    # Fine-tuning: start from the weights of this checkpoint (trained or `nmt import`ed)
    # with a fresh optimizer and schedule; the checkpoint decides the architecture and
    # the data must be encoded with its vocabulary (`nmt prepare --vocab-from`).
    init_from: str = ""
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
    precision: PrecisionSetting = "auto"
    seed: int = 1
    log_interval_steps: int = 50
    validate_bleu_sentences: int = 0  # greedy BLEU on the first M dev sentences; 0 = off
    # TensorBoard logs (scalars, attention images) into <run>/tensorboard: "auto" when
    # tensorboard is installed, true to be warned when it is not, false never.
    tensorboard: bool | Literal["auto"] = "auto"
    threads: int = 0  # 0 = all cores
    # torch.compile of the model: "auto" = on GPUs (where it pays), off on CPUs.
    compile: bool | Literal["auto"] = "auto"
    # The rest of what a GPU gets and a CPU does not (engines/train/device_choices.py),
    # "auto" = by device; set on a CPU, each runs the GPU's path there (the tests do):
    # the output projection fused into the chunked loss,
    fused_projection: bool | Literal["auto"] = "auto"
    # batch widths padded to a multiple of this (auto: 8 on GPUs, 1 on CPUs),
    shape_multiple: int | Literal["auto"] = "auto"
    # the next update's batches prepared while the device works on this one.
    prefetch: bool | Literal["auto"] = "auto"
    # SDPA kernels on GPUs: "auto" = flash / memory-efficient, never cuDNN's per-shape
    # graphs; "flash", "efficient", "cudnn" or "math" to prefer one (backends/pytorch.py).
    attention_backend: AttentionBackend = "auto"

    def __post_init__(self) -> None:
        for name in ("compile", "fused_projection", "prefetch"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or value == "auto"):
                raise SettingError(f"train.{name}", f"must be true, false or 'auto', got {value!r}")
        multiple = self.shape_multiple
        if multiple != "auto" and not (
            isinstance(multiple, int) and not isinstance(multiple, bool) and 1 <= multiple <= 128
        ):
            raise SettingError(
                "train.shape_multiple", f"must be 'auto' or 1 to 128, got {multiple!r}"
            )
        one_of("train", self, "attention_backend", ATTENTION_BACKENDS)
        at_least("train", self, 1, "batch_tokens", "warmup_steps", "keep_last")
        fraction("train", self, "label_smoothing", "adam_beta1", "adam_beta2")
        above("train", self, 0, "lr_scale", "adam_eps")
        # 0 means "no limit" (or "off") for each of these
        at_least("train", self, 0, "max_tokens", "clip_norm", "max_steps", "max_epochs")
        at_least("train", self, 0, "max_time_minutes", "save_interval_minutes")
        at_least("train", self, 0, "save_interval_steps", "log_interval_steps", "threads")
        at_least("train", self, 0, "validate_bleu_sentences", "seed")
        below("train", self, 2**32, "seed")


LENGTH_PENALTY_HELP = (
    "GNMT length penalty: score(Y) = log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha, "
    "|Y| counting the end-of-sentence token"
)


# Sentences a decoding batch holds by default. On a CPU every core decodes its own batch
# and beam search keeps each batch's key/value caches in float32 (core/cache.py): 64
# sentences held `nmt translate`'s peak memory under 1 GB at the speed of 128 (see
# BENCHMARKS.md); a GPU's step costs the same for twice the rows.
CPU_BATCH_SENTENCES = 64
GPU_BATCH_SENTENCES = 128


@dataclass(frozen=True)
class DecodeConfig:
    """Section 6.1: beam 4, length penalty alpha 0.6, maximum length input + 50."""

    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT: lp(Y) = ((5 + |Y|) / 6)^alpha
    max_len_a: float = 1.0  # maximum output length = a * source length + b
    max_len_b: int = 50
    batch_sentences: int = 0  # 0 = auto: CPU_BATCH_SENTENCES or GPU_BATCH_SENTENCES
    batch_tokens: int = 0  # 0 = limit by sentences only
    precision: DecodePrecisionSetting = "auto"  # int8: CPUs only
    average_last: int = 5  # checkpoints averaged for the final model (base 5, big 20)
    nbest: int = 1  # hypotheses kept per sentence (at most beam_size)
    device: str = "auto"  # "cpu", "cuda", "cuda:1", ...; auto = cuda if available
    threads: int = 0  # CPU threads; 0 = all cores available to the process
    workers: int = 0  # CPU batches decoded side by side; 0 = one per thread
    buffer_lines: int = 2000  # read-ahead: lines sorted by length together, memory bound
    compiled_step: bool = True  # CPUs: the decoder step as one C++ call (backends/cpu/step.py)

    def __post_init__(self) -> None:
        one_of("decode", self, "precision", DECODE_PRECISIONS)
        at_least("decode", self, 1, "beam_size", "buffer_lines")
        at_least("decode", self, 1, "average_last", "nbest")
        at_least("decode", self, 0, "length_penalty", "max_len_a", "max_len_b")
        at_least("decode", self, 0, "batch_sentences", "batch_tokens", "threads", "workers")
        if self.nbest > self.beam_size:
            limit = f"must not exceed the beam size ({self.beam_size})"
            raise SettingError("decode.nbest", f"{limit}, got {self.nbest}")


@dataclass(frozen=True)
class ScoreConfig:
    """Which BLEU flavours `nmt run` reports; both by default, always labelled.

    sacreBLEU scores detokenized output against raw references (comparable across papers);
    the paper's figure is tokenized BLEU with hyphenated compounds split (section 6.1).
    A parsing recipe (section 6.3, data from the `ptb` presets) says `metric = "trees"`:
    its outputs are linearized trees, scored by EVALB's labelled bracket F1 instead, and
    the BLEU settings do not apply.
    """

    sacrebleu: bool = True
    paper_bleu: bool = True
    chrf: bool = True
    metric: Literal["bleu", "trees"] = "bleu"


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
    """Read a recipe file, apply its includes and the `--set` overrides, and validate.

    An error names where the bad value came from: the recipe file, or the `--set` that
    gave it (a typo on the command line is not the recipe's fault).
    """
    raw = _read_with_includes(Path(path), seen=())
    origins: dict[str, str] = {}
    for item in overrides or []:
        origins[apply_override(raw, item)] = f"--set {item}"
    return recipe_from_dict(raw, source=str(path), origins=origins)


@dataclass(frozen=True)
class _Blame:
    """Who is responsible for a key: the `--set` that gave it (or a section above it),
    otherwise the recipe file."""

    source: str
    origins: dict[str, str]

    def __call__(self, key: str) -> str:
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            origin = self.origins.get(".".join(parts[:n]))
            if origin is not None:
                return origin
        return self.source


def recipe_from_dict(
    raw: dict[str, Any], source: str = "recipe", origins: dict[str, str] | None = None
) -> RecipeConfig:
    blame = _Blame(source, origins or {})
    try:
        return _build(RecipeConfig, raw, prefix="", blame=blame)
    except SettingError as exc:  # a range check, which names its key
        raise _config_error(blame(exc.key), str(exc)) from None
    except ValueError as exc:  # another __post_init__ invariant
        raise ConfigError(f"{source}: {exc}") from None


def apply_override(raw: dict[str, Any], item: str) -> str:
    """`section.key=value`: the value is parsed as TOML, or kept as a bare string.
    Returns the dotted key."""
    key, sep, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or not all(p.strip() for p in parts):
        raise OverrideError(f"--set {item!r}: expected section.key=value, e.g. train.max_steps=100")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise OverrideError(f"--set {item}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value
    return key


def _read_with_includes(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path.name}: include cycle through {', '.join(p.name for p in seen)}")
    raw = _parse_recipe_file(path, included_from=seen[-1] if seen else None)
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(
            f"{path}: include must be a file name or a list of file names, "
            f'e.g. include = "base.toml"; got {includes!r}'
        )
    merged: dict[str, Any] = {}
    for inc in includes:
        _deep_merge(merged, _read_with_includes(path.parent / inc, (*seen, path)))
    _deep_merge(merged, raw)
    return merged


def _parse_recipe_file(path: Path, included_from: Path | None) -> dict[str, Any]:
    """The TOML table of one recipe file; every way the file can be unusable is one line."""
    by = f" (included from {included_from})" if included_from else ""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a recipe file{by}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such recipe file{by}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}){by}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
            "a recipe is a UTF-8 TOML file"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def _build(cls: type[Any], raw: Any, prefix: str, blame: _Blame) -> Any:
    where = prefix.rstrip(".") or "the recipe"
    if not isinstance(raw, dict):
        raise _config_error(blame(where), f"{where} must be a table of settings")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            valid = ", ".join(sorted(fields))
            raise _config_error(
                blame(prefix + key), f"unknown key {prefix}{key}{hint} (valid: {valid})"
            )
        hint_type = hints[key]
        if isinstance(hint_type, type) and dataclasses.is_dataclass(hint_type):
            kwargs[key] = _build(hint_type, value, f"{prefix}{key}.", blame)
        else:
            kwargs[key] = _check_value(value, hint_type, f"{prefix}{key}", blame(prefix + key))
    return cls(**kwargs)


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _describe(hint: Any) -> str:
    """What a value of type `hint` looks like, for an error message."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " or ".join(map(repr, typing.get_args(hint)))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        text = " or ".join(_describe(a) for a in options)
        return text + (" or none" if len(options) < len(typing.get_args(hint)) else "")
    return _EXPECTED.get(hint, str(hint))


def _check_value(value: Any, hint: Any, key: str, source: str) -> Any:
    """Return `value` if it fits `hint` (ints are accepted where floats are expected)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value in allowed:
            return value
        raise _config_error(source, f"{key} must be one of {', '.join(map(repr, allowed))}")
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option is type(None) and value is None:
                return None
            try:
                return _check_value(value, option, key, source)
            except ConfigError:
                continue
        raise _config_error(source, f"{key} must be {_describe(hint)}, got {value!r}")
    expected = _EXPECTED
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _config_error(source, f"{key} must be an integer, got {value!r}")
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _config_error(source, f"{key} must be {expected.get(hint, str(hint))}, got {value!r}")
