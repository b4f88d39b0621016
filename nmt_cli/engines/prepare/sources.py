"""Where a corpus comes from: presets, local directories, explicit paths, `datasets` data.

Every source is resolved to a `Corpus`: a description for the manifest and, per split
("train", "valid", "test"), an object whose `pairs()` streams (source, target) strings.
The presets go through the real `datasets.load_dataset` code path; local Parquet/JSON
files and `save_to_disk` directories go through the same library, which is how the tests
prove that path offline.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nmt_cli.engines.prepare.demo_corpus import DEMO_SPLITS, DEMO_VERSION, DemoStream
from nmt_cli.engines.prepare.multi30k import DEFAULT_TEST, MULTI30K, Multi30kPreset, fetch_multi30k
from nmt_cli.engines.prepare.presets import DEMO, PRESETS, Preset, preset_names
from nmt_cli.engines.prepare.treebank import SRC, TGT, TREEBANKS, read_treebank, target_form
from nmt_cli.errors import NmtError
from nmt_cli.optional import require
from nmt_cli.text_io import LineDecoder, TextPairs, check_readable, one_line

_ROLE_WORDS = {"train": ("train",), "valid": ("valid", "validation", "val", "dev")}
_ROLE_WORDS["test"] = ("test",)
_DATA_SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


class SplitSource(Protocol):
    """One split: `pairs()` streams it; `total` is its size when known in advance."""

    @property
    def total(self) -> int | None: ...

    def pairs(self) -> Iterator[tuple[str, str]]: ...


@dataclass(frozen=True)
class Corpus:
    """A resolved source: its direction, its splits, and what the manifest says of it."""

    src: str
    tgt: str
    splits: dict[str, SplitSource]
    info: dict[str, Any]  # what the manifest records about the source
    character_coverage: float = 1.0  # SentencePiece's; below 1 for the large WMT alphabets
    decoder: LineDecoder | None = None  # counts replaced UTF-8 lines of text sources
    # what the model learns of a target, when not the target itself (a tree's linearization);
    # dev/test keep the target itself as their raw text, the reference it is scored against
    target_form: Callable[[str], str] | None = None


@dataclass(frozen=True)
class SourceRequest:
    """What the user named: a preset, a path (`--from`), or explicit files per split."""

    preset: str = ""
    source: str = ""
    files: tuple[tuple[str, str, str], ...] = ()  # (split, source path, target path)
    src: str = ""
    tgt: str = ""
    valid_split: str = ""
    test_split: str = ""
    cache_dir: str = ""
    on_bad_utf8: str = "error"
    tree_leaves: str = "xx"  # a treebank's targets: XX or the word at each leaf


def resolve_corpus(req: SourceRequest) -> Corpus:
    """Turn a request into a streamable corpus, or raise an NmtError saying what is wrong."""
    chosen = [bool(req.preset), bool(req.source), bool(req.files)]
    copies = req.preset in MULTI30K or req.preset in TREEBANKS  # presets --from may name
    local_copy = copies and req.source and not req.files
    if sum(chosen) > 1 and not local_copy:
        raise NmtError("name one source: a preset, --from PATH, or explicit --train-src files")
    if req.tree_leaves != "xx" and req.preset not in TREEBANKS:
        raise NmtError("--tree-leaves is for treebanks (nmt prepare ptb, ptb-sample)")
    if req.preset:
        if req.preset == DEMO:
            return _demo(req)
        if req.preset in MULTI30K:
            return _multi30k(MULTI30K[req.preset], req)
        if req.preset in TREEBANKS:
            return _treebank(req)
        if req.preset in PRESETS:
            return _preset(PRESETS[req.preset], req)
        raise NmtError(
            f"unknown corpus '{req.preset}'; valid presets: {', '.join(preset_names())} "
            "(or pass --from DIR for local files)"
        )
    if not (req.source or req.files):
        raise NmtError(
            "nothing to prepare: name a preset (see nmt prepare --list), --from DIR, "
            "or --train-src/--train-tgt with --valid-src/--valid-tgt"
        )
    if not (req.src and req.tgt):
        raise NmtError("local data needs --src and --tgt language codes (e.g. --src en --tgt de)")
    if req.src == req.tgt:
        raise NmtError(f"--src and --tgt are both '{req.src}'; they must differ")
    if req.files:
        return _explicit_files(req)
    return _local_path(Path(req.source), req)


def _direction(req: SourceRequest, src: str, tgt: str, name: str) -> tuple[str, str]:
    """A preset's direction, or the reverse one when --src/--tgt ask for it."""
    want = (req.src or src, req.tgt or tgt)
    if want in ((src, tgt), (tgt, src)):
        return want
    raise NmtError(
        f"{name} translates {src}->{tgt} (or {tgt}->{src}); --src {want[0]} --tgt {want[1]} "
        "does not match it"
    )


# --- the demo ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListPairs:
    """A split held in memory (the demo's)."""

    items: list[tuple[str, str]]

    @property
    def total(self) -> int | None:
        return len(self.items)

    def pairs(self) -> Iterator[tuple[str, str]]:
        return iter(self.items)


@dataclass(frozen=True)
class DemoTrainPairs:
    """The demo's training split, made as it is read (`DemoStream.train`)."""

    stream: DemoStream
    flip: bool

    @property
    def total(self) -> int | None:
        return DEMO_SPLITS["train"]

    def pairs(self) -> Iterator[tuple[str, str]]:
        for a, b in self.stream.train():
            yield (b, a) if self.flip else (a, b)


def _demo(req: SourceRequest) -> Corpus:
    """The demo is one fixed corpus (seed 1); --seed only steers sampling, as elsewhere."""
    src, tgt = _direction(req, "en", "de", DEMO)
    stream = DemoStream(1)
    flip = src != "en"
    splits: dict[str, SplitSource] = {
        name: ListPairs([(b, a) for a, b in pairs] if flip else pairs)
        for name, pairs in stream.held_out.items()
    }
    splits = {"train": DemoTrainPairs(stream, flip), **splits}
    info = {"kind": "demo", "version": DEMO_VERSION, "sizes": dict(DEMO_SPLITS)}
    return Corpus(src, tgt, splits, info)


# --- Multi30k: downloaded files (or a local copy) read as a directory of text ----------


def _multi30k(preset: Multi30kPreset, req: SourceRequest) -> Corpus:
    src, tgt = _direction(req, preset.src, preset.tgt, preset.name)
    folder = Path(req.source) if req.source else fetch_multi30k(src, tgt, req.cache_dir)
    local = dataclasses.replace(
        req, preset="", src=src, tgt=tgt, test_split=req.test_split or DEFAULT_TEST
    )
    corpus = _local_path(folder, local)
    info = {
        "kind": "preset",
        "name": preset.name,
        "from": str(folder.resolve()) if req.source else "download",
        "files": corpus.info["files"],
    }
    return dataclasses.replace(corpus, info=info)


# --- the Penn Treebank: sentences and their trees (engines/prepare/treebank.py) ---------


def _treebank(req: SourceRequest) -> Corpus:
    if (req.src or SRC, req.tgt or TGT) != (SRC, TGT):
        raise NmtError(f"{req.preset} parses {SRC} into {TGT}s; drop --src/--tgt")
    if req.valid_split or req.test_split:
        raise NmtError(f"{req.preset} has a fixed split of its files; drop --valid/--test-split")
    read = read_treebank(TREEBANKS[req.preset], req.source, req.cache_dir, req.tree_leaves)
    splits: dict[str, SplitSource] = {name: ListPairs(p) for name, p in read.pairs.items() if p}
    info = {**read.info, "whole_words": list(read.whole_words)}
    form = functools.partial(target_form, leaves=req.tree_leaves)
    return Corpus(SRC, TGT, splits, info, target_form=form)


# --- datasets (Hub presets and local files) ------------------------------------------------


@dataclass(frozen=True)
class DatasetPairs:
    """A `datasets.Dataset` split, streamed in batches from its memory-mapped Arrow table."""

    dataset: Any
    src: str
    tgt: str

    @property
    def total(self) -> int | None:
        return len(self.dataset)

    def pairs(self) -> Iterator[tuple[str, str]]:
        nested = "translation" in self.dataset.column_names
        for batch in self.dataset.iter(batch_size=2048):
            if nested:
                for row in batch["translation"]:
                    yield one_line(row[self.src]), one_line(row[self.tgt])
            else:
                for a, b in zip(batch[self.src], batch[self.tgt], strict=True):
                    yield one_line(a), one_line(b)


def _check_schema(dataset: Any, src: str, tgt: str, where: str) -> None:
    columns = list(dataset.column_names)
    if "translation" in columns:
        feature = dataset.features["translation"]
        keys = set(getattr(feature, "languages", None) or getattr(feature, "keys", lambda: [])())
        if not keys and len(dataset):
            keys = set(dataset[0]["translation"])
        missing = [lang for lang in (src, tgt) if lang not in keys]
        if missing:
            raise NmtError(
                f"{where}: the translation column has languages {', '.join(sorted(keys))}, "
                f"not {', '.join(missing)}; check --src/--tgt"
            )
        return
    if src in columns and tgt in columns:
        return
    raise NmtError(
        f'{where}: expected the WMT14 schema {{"translation": {{"{src}": ..., "{tgt}": ...}}}} '
        f"or columns '{src}' and '{tgt}'; found columns {', '.join(columns)}"
    )


def _dataset_corpus(
    splits_in: dict[str, Any],
    src: str,
    tgt: str,
    info: dict[str, Any],
    where: str,
    character_coverage: float = 1.0,
) -> Corpus:
    splits: dict[str, SplitSource] = {}
    for name, dataset in splits_in.items():
        _check_schema(dataset, src, tgt, f"{where} ({name})")
        splits[name] = DatasetPairs(dataset, src, tgt)
    _require_train_valid(splits, where)
    return Corpus(src, tgt, splits, info, character_coverage)


def _hf_splits(dataset_dict: Any, valid_split: str = "", test_split: str = "") -> dict[str, Any]:
    """Map a DatasetDict's split names (validation, dev, ...) onto train/valid/test."""
    roles = _pick_roles(dataset_dict.keys(), valid_split, test_split, "split", "")
    return {role: dataset_dict[name] for role, name in roles}


def _datasets(purpose: str, avoid: str) -> Any:
    return require("datasets", purpose=purpose, avoid=avoid)


def _preset(preset: Preset, req: SourceRequest) -> Corpus:
    src, tgt = _direction(req, preset.src, preset.tgt, preset.name)
    datasets = _datasets(
        f"the {preset.name} preset", "prepare the corpus from text files with --from DIR"
    )

    try:
        loaded = datasets.load_dataset(
            preset.hf_path, preset.hf_name, cache_dir=req.cache_dir or None
        )
    except Exception as exc:  # network, Hub or cache failures all end the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NmtError(
            f"could not load {preset.hf_path} ({preset.hf_name}) with datasets: {first}; "
            "check the network, or point --cache-dir at a cache that holds it"
        ) from None
    info = {"kind": "preset", "name": preset.name, "dataset": preset.hf_path}
    info["config"] = preset.hf_name
    return _dataset_corpus(
        _hf_splits(loaded),
        src,
        tgt,
        info,
        preset.name,
        character_coverage=preset.character_coverage,
    )


def _local_datasets(path: Path, req: SourceRequest) -> Corpus | None:
    """A save_to_disk directory, or Parquet/JSON files named by split; None if neither
    (text files need no `datasets`)."""
    avoid = f"give --from a directory of text files (train.{req.src or 'SRC'}.gz, ...)"
    info: dict[str, Any] = {"kind": "datasets", "path": str(path.resolve())}
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        datasets = _datasets(f"reading the saved dataset {path}", avoid)
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise NmtError(f"{path}: not a readable saved dataset ({exc})") from None
        if isinstance(loaded, datasets.Dataset):
            raise NmtError(
                f"{path}: a single saved Dataset; save a DatasetDict with train and "
                "validation (and test) splits"
            )
        splits = _hf_splits(loaded, req.valid_split, req.test_split)
        return _dataset_corpus(splits, req.src, req.tgt, info, str(path))
    by_split: dict[str, list[str]] = {}
    builder = ""
    for f in sorted(path.iterdir()):
        kind = _DATA_SUFFIXES.get(f.suffix)
        stem = f.name.split(".")[0]
        if kind and _role_of(stem):
            if builder and kind != builder:
                raise NmtError(f"{path}: mixes Parquet and JSON files; keep one format")
            builder = kind
            by_split.setdefault(stem, []).append(str(f))
    if not by_split:
        return None
    roles = _pick_roles(by_split, req.valid_split, req.test_split, "split", "")
    chosen = {role: by_split[name] for role, name in roles}
    info["files"] = {role: [Path(f).name for f in files] for role, files in chosen.items()}
    datasets = _datasets(f"reading the {builder} files of {path}", avoid)
    try:
        loaded = datasets.load_dataset(builder, data_files=chosen, cache_dir=req.cache_dir or None)
    except Exception as exc:
        raise NmtError(f"{path}: datasets could not read the {builder} files ({exc})") from None
    return _dataset_corpus(dict(loaded), req.src, req.tgt, info, str(path))


# --- split names, and local parallel text ------------------------------------------------


def _role_of(stem: str) -> str:
    """'train' for train*, 'valid' for valid*/val*/dev*, 'test' for test*; else ''."""
    low = stem.lower()
    for role, words in _ROLE_WORDS.items():
        for word in words:
            if low == word or re.match(rf"^{word}[\d._-]", low):
                return role
    return ""


def _pick(role: str, candidates: list[str], choice: str, what: str, where: str) -> str:
    """One candidate for a role: the user's choice, the plain name, or the only one."""
    place = f" in {where}" if where else ""
    if choice:
        if choice in candidates:
            return choice
        raise NmtError(
            f"no {role} {what} named '{choice}'{place} (have: {', '.join(candidates) or 'none'})"
        )
    if len(candidates) <= 1:
        return candidates[0] if candidates else ""
    plain = [c for c in candidates if c.lower() in _ROLE_WORDS[role]]
    if len(plain) == 1:
        return plain[0]
    option = "--test-split" if role == "test" else "--valid-split"
    if role == "train":
        raise NmtError(f"several train {what}s{place}: {', '.join(candidates)}; keep one")
    raise NmtError(
        f"several {role} {what}s{place}: {', '.join(sorted(candidates))}; choose one with {option}"
    )


def _pick_roles(
    names: Iterable[str], valid_split: str, test_split: str, what: str, where: str
) -> Iterator[tuple[str, str]]:
    """(role, name) for each role some name fills, in the order train, valid, test.

    Lazy, so a caller's check of one role's files runs before the next role is picked.
    """
    names = list(names)
    for role, choice in (("train", ""), ("valid", valid_split), ("test", test_split)):
        found = _pick(role, [n for n in names if _role_of(n) == role], choice, what, where)
        if found:
            yield role, found


def _text_stems(path: Path, lang: str) -> dict[str, Path]:
    """{stem: file} for files named STEM.LANG, or STEM.LANG.gz (.xz, .bz2): the reader
    recognises compression by content, the suffix only names the file."""
    out: dict[str, Path] = {}
    for f in sorted(path.iterdir()):
        name = f.name
        for suffix in (".gz", ".xz", ".bz2"):
            name = name.removesuffix(suffix)
        stem, dot, suffix = name.rpartition(".")
        if dot and suffix == lang and f.is_file():
            out[stem] = f
    return out


def _local_path(path: Path, req: SourceRequest) -> Corpus:
    if not path.exists():
        raise NmtError(f"{path}: no such directory")
    if not path.is_dir():
        raise NmtError(f"{path}: --from takes a directory; for single files use --train-src etc.")
    local = _local_datasets(path, req)
    if local is not None:
        return local
    src_files, tgt_files = _text_stems(path, req.src), _text_stems(path, req.tgt)
    decoder = LineDecoder(req.on_bad_utf8)
    splits: dict[str, SplitSource] = {}
    files: dict[str, list[str]] = {}
    stems = sorted({*src_files, *tgt_files})
    for role, found in _pick_roles(stems, req.valid_split, req.test_split, "file set", str(path)):
        for lang, table in ((req.src, src_files), (req.tgt, tgt_files)):
            if found not in table:
                other = src_files.get(found) or tgt_files.get(found)
                raise NmtError(f"{path}: {other.name if other else found} has no {lang} partner")
        splits[role] = TextPairs(src_files[found], tgt_files[found], decoder)
        files[role] = [src_files[found].name, tgt_files[found].name]
    if not splits:
        raise NmtError(
            f"{path}: no train/valid/test files for {req.src}-{req.tgt} (expected names like "
            f"train.{req.src}.gz and train.{req.tgt}.gz, or Parquet/JSON files)"
        )
    _require_train_valid(splits, str(path))
    info = {"kind": "text", "path": str(path.resolve()), "files": files}
    return Corpus(req.src, req.tgt, splits, info, decoder=decoder)


def _explicit_files(req: SourceRequest) -> Corpus:
    decoder = LineDecoder(req.on_bad_utf8)
    splits: dict[str, SplitSource] = {}
    for split, src_path, tgt_path in req.files:
        for p in (src_path, tgt_path):
            check_readable(p)
        splits[split] = TextPairs(Path(src_path), Path(tgt_path), decoder)
    _require_train_valid(splits, "the command line")
    files = {split: [str(Path(a).resolve()), str(Path(b).resolve())] for split, a, b in req.files}
    info = {"kind": "text", "files": files}
    return Corpus(req.src, req.tgt, splits, info, decoder=decoder)


def _require_train_valid(splits: dict[str, SplitSource], where: str) -> None:
    for needed in ("train", "valid"):
        if needed not in splits:
            hint = "valid, val or dev" if needed == "valid" else "train"
            raise NmtError(f"{where}: no {needed} split found (name it {hint})")
