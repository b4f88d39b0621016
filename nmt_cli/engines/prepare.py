"""`nmt prepare`: a corpus in, a data directory (vocabulary + token stores + manifest) out.

Four stages, each resumable: clean (stream the source, drop bad pairs, write the kept text
to a work folder), vocab (SentencePiece BPE on a bounded sample of the cleaned lines),
binarize (encode each split with a process pool into memory-mapped token stores), and
manifest (settings, counts, versions and checksums, written last and atomically: its
presence means the directory is complete). A small state file in the work folder records
the settings and each finished stage, so a rerun skips what is done and a rerun with other
settings is refused with the setting that differs. Every file is written atomically and
every stage is deterministic, so an interrupted run, rerun, gives the same manifest as an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli import __version__
from nmt_cli.core.data import TokenStoreWriter
from nmt_cli.core.files import atomic_path, atomic_write_bytes, atomic_write_text
from nmt_cli.data_dir import DATA_FORMAT, DATA_VERSION, MANIFEST, open_data_dir, sha256_file
from nmt_cli.engines.binarize import encode_to_stores
from nmt_cli.engines.cleaning import CleanRules, PairCleaner
from nmt_cli.engines.corpora import (
    DEMO,
    DEMO_VOCAB_SIZE,
    PRESETS,
    SPLITS,
    Corpus,
    SourceRequest,
    resolve_corpus,
    seeded_sample,
)
from nmt_cli.engines.text_files import BAD_UTF8_CHOICES
from nmt_cli.engines.vocab_sample import sample_indices, sampled_lines, train_vocab
from nmt_cli.errors import NmtError

if TYPE_CHECKING:  # the recipe config imports torch; prepare itself needs none of it
    from nmt_cli.config import DataConfig

WORK = ".prepare"  # work folder inside the data directory, removed once complete
STATE = "state.json"
STAGES = ("clean", "vocab", "binarize", "manifest")
LOCAL_VOCAB_SIZE = 8000
# below this many pairs, starting worker processes costs more than it saves
POOL_MIN_PAIRS = 50_000


@dataclass(frozen=True)
class PrepareConfig:
    """Everything `nmt prepare` can be told; `settings()` is the part that shapes the output."""

    out: str
    preset: str = ""  # "demo", "wmt14-en-de", ...
    source: str = ""  # --from: a directory of text, Parquet/JSON files or a saved dataset
    files: tuple[tuple[str, str, str], ...] = ()  # explicit (split, source, target) paths
    src: str = ""  # empty with a preset: the preset's direction
    tgt: str = ""
    vocab_size: int = 0  # 0 = the preset's size (8,000 for local data)
    joint_vocab: bool = True
    max_len: int = 250
    max_len_ratio: float = 1.5
    dedup: bool = False
    normalize_punctuation: bool = False
    max_pairs: int = 0  # 0 = all training pairs
    sample_max_pairs: bool = False  # a seeded sample of max_pairs instead of the first ones
    valid_split: str = ""
    test_split: str = ""
    seed: int = 1
    on_bad_utf8: str = "error"
    vocab_sample_lines: int = 1_000_000  # lines SentencePiece trains on, at most
    cache_dir: str = ""  # datasets cache; does not change the result
    workers: int = 0  # encoding processes, 0 = one per core; does not change the result
    force: bool = False

    def __post_init__(self) -> None:
        if self.vocab_size and self.vocab_size < 8:
            raise NmtError(f"--vocab-size must be at least 8, got {self.vocab_size}")
        if self.max_len < 0:
            raise NmtError(f"--max-len must be >= 0 (0 = no limit), got {self.max_len}")
        if self.max_len_ratio and self.max_len_ratio < 1.0:
            raise NmtError(f"--max-len-ratio must be >= 1 (0 = none), got {self.max_len_ratio}")
        if self.max_pairs < 0:
            raise NmtError(f"--max-pairs must be >= 0, got {self.max_pairs}")
        if self.on_bad_utf8 not in BAD_UTF8_CHOICES:
            raise NmtError(f"--on-bad-utf8 must be one of {', '.join(BAD_UTF8_CHOICES)}")
        if self.vocab_sample_lines < 1000:
            raise NmtError(f"--vocab-sample-lines must be >= 1000, got {self.vocab_sample_lines}")

    def effective_vocab_size(self) -> int:
        if self.vocab_size:
            return self.vocab_size
        if self.preset == DEMO:
            return DEMO_VOCAB_SIZE
        if self.preset in PRESETS:
            return PRESETS[self.preset].vocab_size
        return LOCAL_VOCAB_SIZE

    def source_request(self) -> SourceRequest:
        return SourceRequest(
            preset=self.preset,
            source=self.source,
            files=self.files,
            src=self.src,
            tgt=self.tgt,
            valid_split=self.valid_split,
            test_split=self.test_split,
            cache_dir=self.cache_dir,
            on_bad_utf8=self.on_bad_utf8,
        )

    def settings(self) -> dict[str, Any]:
        """The settings that decide the output, in a canonical, comparable form."""
        # split choices are checked against the files actually chosen (see _check_choices):
        # `--test-split test_2016_flickr` and no option pick the same file in Multi30k
        skip = {"out", "cache_dir", "workers", "force", "vocab_size", "source", "files"}
        skip |= {"valid_split", "test_split"}
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }
        out["source"] = str(Path(self.source).resolve()) if self.source else ""
        out["files"] = [
            [s, str(Path(a).resolve()), str(Path(b).resolve())] for s, a, b in self.files
        ]
        out["vocab_size"] = self.effective_vocab_size()
        out["src"], out["tgt"] = self.direction()
        return out

    def direction(self) -> tuple[str, str]:
        """(src, tgt) as the output will have them: a preset fills in what is not given."""
        if self.preset == DEMO:
            default = ("en", "de")
        elif self.preset in PRESETS:
            default = (PRESETS[self.preset].src, PRESETS[self.preset].tgt)
        else:
            return self.src, self.tgt
        return self.src or default[0], self.tgt or default[1]


def prepare_from_data_config(
    data: DataConfig, workers: int = 0, force: bool = False, cache_dir: str = ""
) -> PrepareConfig:
    """The prepare settings a recipe's [data] section describes (used by `nmt run`)."""
    return PrepareConfig(
        out=data.dir,
        preset=data.preset,
        source=data.source_dir,
        src=data.src,
        tgt=data.tgt,
        vocab_size=data.vocab_size,
        joint_vocab=data.joint_vocab,
        max_len=data.max_len,
        max_len_ratio=data.max_len_ratio,
        dedup=data.dedup,
        normalize_punctuation=data.normalize_punctuation,
        max_pairs=data.max_pairs,
        sample_max_pairs=data.sample_max_pairs,
        valid_split=data.valid_split,
        test_split=data.test_split,
        seed=data.seed,
        on_bad_utf8=data.on_bad_utf8,
        cache_dir=cache_dir or data.cache_dir,
        workers=workers,
        force=force,
    )


# --- progress and results ------------------------------------------------------------------


@dataclass(frozen=True)
class StageEvent:
    """What the engine tells its caller; the CLI turns these into rich progress bars."""

    stage: str  # one of STAGES
    kind: str  # "start" | "advance" | "end" | "skip"
    label: str = ""
    total: int | None = None
    advance: int = 0


Progress = Callable[[StageEvent], None]


@dataclass(frozen=True)
class StageReport:
    stage: str
    ran: bool
    seconds: float
    pairs: int  # pairs the stage processed (0 when skipped)


@dataclass(frozen=True)
class PrepareResult:
    out: Path
    manifest: dict[str, Any]
    stages: list[StageReport]
    up_to_date: bool  # nothing had to be done


# --- the pipeline --------------------------------------------------------------------------


@dataclass
class _State:
    """The work folder's record of settings and finished stages."""

    path: Path
    settings: dict[str, Any]
    done: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        text = json.dumps({"settings": self.settings, "done": self.done}, indent=2)
        atomic_write_text(self.path, text + "\n")

    def finish(self, stage: str, info: Any) -> None:
        self.done[stage] = info
        self.save()


def prepare(cfg: PrepareConfig, progress: Progress | None = None) -> PrepareResult:
    """Run (or resume) every stage that is not yet done; return the manifest and timings."""
    return _Run(cfg, progress or (lambda event: None)).run()


class _Run:
    def __init__(self, cfg: PrepareConfig, progress: Progress) -> None:
        self.cfg = cfg
        self.progress = progress
        self.out = Path(cfg.out)
        self.work = self.out / WORK
        self.settings = cfg.settings()
        self.reports: list[StageReport] = []
        self.corpus: Corpus | None = None

    # orchestration

    def run(self) -> PrepareResult:
        cfg = self.cfg
        if cfg.preset and cfg.preset != DEMO and cfg.preset not in PRESETS:
            resolve_corpus(cfg.source_request())  # raises the "unknown corpus" error
        if self.out.exists() and not self.out.is_dir():
            raise NmtError(f"{self.out}: exists and is not a directory; choose another --out")
        if (self.out / MANIFEST).is_file() and not cfg.force:
            return self._up_to_date()
        state = self._load_state()
        if state is not None:
            self._invalidate_missing(state)
        created = not self.out.exists()
        if state is None or "clean" not in state.done:
            self.corpus = resolve_corpus(cfg.source_request())  # bad input fails before writing
        try:
            self.work.mkdir(parents=True, exist_ok=True)
            self._remove_temporaries()
            if state is None:
                state = _State(self.work / STATE, self.settings)
                state.save()
            return self._stages(state)
        except NmtError:
            if created:  # nothing of value was made: leave no directory behind
                shutil.rmtree(self.out, ignore_errors=True)
            raise

    def _stages(self, state: _State) -> PrepareResult:
        if "clean" in state.done:
            self._skip("clean")
        else:
            for later in ("vocab", "binarize"):
                state.done.pop(later, None)
            self._timed("clean", lambda: self._clean(state))
        if "vocab" in state.done:
            self._skip("vocab")
        else:
            state.done.pop("binarize", None)
            self._timed("vocab", lambda: self._vocab(state))
        if len(state.done.get("binarize", {})) == len(state.done["clean"]["splits"]):
            self._skip("binarize")
        else:
            self._timed("binarize", lambda: self._binarize(state))
        manifest: dict[str, Any] = {}

        def write_manifest() -> int:
            manifest.update(self._manifest(state))
            return 0

        self._timed("manifest", write_manifest)
        shutil.rmtree(self.work, ignore_errors=True)
        return PrepareResult(self.out, manifest, self.reports, up_to_date=False)

    def _timed(self, stage: str, body: Callable[[], int]) -> None:
        start = time.perf_counter()
        pairs = body()
        self.reports.append(StageReport(stage, True, time.perf_counter() - start, pairs))

    def _skip(self, stage: str) -> None:
        self.progress(StageEvent(stage, "skip", f"{stage} (done before)"))
        self.reports.append(StageReport(stage, False, 0.0, 0))

    # directory housekeeping

    def _load_state(self) -> _State | None:
        path = self.work / STATE
        if path.is_file():
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                raw = None
            if raw is not None:
                if self.cfg.force:
                    self._wipe()
                    return None
                _compare_settings(self.out, raw["settings"], self.settings)
                done = raw.get("done", {})
                if "clean" in done:
                    self._check_choices(done["clean"]["source"])
                return _State(path, raw["settings"], done)
        if self.out.is_dir() and any(self.out.iterdir()) and not self._only_ours():
            raise NmtError(
                f"{self.out}: exists, is not empty and was not made by nmt prepare; "
                "choose a new or empty --out"
            )
        if self.cfg.force:
            self._wipe()
        return None

    def _check_choices(self, source: dict[str, Any]) -> None:
        """--valid-split/--test-split must name the files the directory was made from."""
        files = source.get("files", {})
        for role, choice in (("valid", self.cfg.valid_split), ("test", self.cfg.test_split)):
            chosen = Path(files[role][0]).name.split(".")[0] if files.get(role) else ""
            if choice and chosen and choice != chosen:
                raise NmtError(
                    f"{self.out} was prepared with the {role} set '{chosen}', not '{choice}'; "
                    "rerun with --force to prepare it again, or choose another --out"
                )

    def _only_ours(self) -> bool:
        return all(p.name in _our_names() or p.name.endswith(".tmp") for p in self.out.iterdir())

    def _wipe(self) -> None:
        """--force: remove what a previous prepare wrote here, and nothing else."""
        for name in _our_names():
            path = self.out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        self._remove_temporaries()

    def _remove_temporaries(self) -> None:
        """Temporary files of a killed run (atomic writes that never got renamed)."""
        for folder in (self.out, self.work):
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)

    def _invalidate_missing(self, state: _State) -> None:
        """A finished stage whose files are gone is not finished."""
        clean = state.done.get("clean")
        if clean and not all(
            (self.work / f"{s}.{side}").is_file()
            for s in clean["splits"]
            for side in ("src", "tgt")
        ):
            state.done.pop("clean")
        vocab = state.done.get("vocab")
        if vocab and not all((self.out / f).is_file() for f in vocab["files"]):
            state.done.pop("vocab")
        for split in list(state.done.get("binarize", {})):
            names = [f"{split}.{side}.{ext}" for side in ("src", "tgt") for ext in ("bin", "idx")]
            if not all((self.out / n).is_file() for n in names):
                state.done["binarize"].pop(split)

    def _up_to_date(self) -> PrepareResult:
        data = open_data_dir(self.out)
        _compare_settings(self.out, data.manifest.get("settings", {}), self.settings)
        self._check_choices(data.manifest.get("source", {}))
        changed = data.changed_files()
        if changed:
            raise NmtError(
                f"{self.out}: {', '.join(changed)} changed since it was prepared; "
                "rerun with --force to prepare it again"
            )
        shutil.rmtree(self.work, ignore_errors=True)  # left by a run killed after its manifest
        self._remove_temporaries()
        for stage in STAGES:
            self._skip(stage)
        return PrepareResult(self.out, data.manifest, self.reports, up_to_date=True)

    # stage 1: clean

    def _clean(self, state: _State) -> int:
        cfg = self.cfg
        assert self.corpus is not None
        corpus = self.corpus
        rules = CleanRules(cfg.max_len, cfg.max_len_ratio, cfg.dedup, cfg.normalize_punctuation)
        info: dict[str, Any] = {"splits": {}, "source": corpus.info}
        info["src"], info["tgt"] = corpus.src, corpus.tgt
        info["character_coverage"] = corpus.character_coverage
        total_read = 0
        for split in SPLITS:
            if split not in corpus.splits:
                continue
            source = corpus.splits[split]
            cleaner = PairCleaner(rules, corpus.src, corpus.tgt)
            pairs: Iterable[tuple[str, str]] = source.pairs()
            total = source.total
            if split == "train" and cfg.max_pairs:
                total = min(total, cfg.max_pairs) if total is not None else cfg.max_pairs
                pairs = (
                    seeded_sample(pairs, cfg.max_pairs, cfg.seed)
                    if cfg.sample_max_pairs
                    else islice(pairs, cfg.max_pairs)
                )
            self.progress(StageEvent("clean", "start", f"clean {split}", total))
            if split == "train":
                stats = self._clean_train(pairs, cleaner)
                if stats["kept"] == 0:
                    dropped = ", ".join(f"{k} {v:,}" for k, v in stats["dropped"].items() if v)
                    raise NmtError(
                        f"no training pairs left after cleaning (read {stats['read']:,}; "
                        f"dropped: {dropped or 'none'}); check the input files or "
                        "--max-len / --max-len-ratio"
                    )
            else:
                stats = self._keep_heldout(split, pairs, cleaner)
            self.progress(StageEvent("clean", "end", f"clean {split}"))
            info["splits"][split] = stats
            total_read += stats["read"]
        info["bad_utf8_replaced"] = corpus.decoder.replaced if corpus.decoder else 0
        state.finish("clean", info)
        return total_read

    def _clean_train(
        self, pairs: Iterable[tuple[str, str]], cleaner: PairCleaner
    ) -> dict[str, Any]:
        with ExitStack() as stack:
            src_tmp = stack.enter_context(atomic_path(self.work / "train.src"))
            tgt_tmp = stack.enter_context(atomic_path(self.work / "train.tgt"))
            fs = stack.enter_context(open(src_tmp, "w", encoding="utf-8", newline="\n"))
            ft = stack.enter_context(open(tgt_tmp, "w", encoding="utf-8", newline="\n"))
            for src, tgt in pairs:
                kept = cleaner.clean(src, tgt)
                if kept is not None:
                    fs.write(kept[0] + "\n")
                    ft.write(kept[1] + "\n")
                if cleaner.stats.read % 10_000 == 0:
                    self.progress(StageEvent("clean", "advance", "clean train", advance=10_000))
            rest = cleaner.stats.read % 10_000
            self.progress(StageEvent("clean", "advance", "clean train", advance=rest))
            fs.close()
            ft.close()
        return cleaner.stats.as_dict()

    def _keep_heldout(
        self, split: str, pairs: Iterable[tuple[str, str]], cleaner: PairCleaner
    ) -> dict[str, Any]:
        """Dev and test sets are never filtered: BLEU must be on the whole official set.

        The raw text is kept for scoring; the text to encode is normalized like train's.
        """
        paths = [self.out / f"{split}.src.txt", self.out / f"{split}.tgt.txt"]
        paths += [self.work / f"{split}.src", self.work / f"{split}.tgt"]
        n = 0
        with ExitStack() as stack:
            tmps = [stack.enter_context(atomic_path(p)) for p in paths]
            fhs = [stack.enter_context(open(t, "w", encoding="utf-8", newline="\n")) for t in tmps]
            for src, tgt in pairs:
                src, tgt = src.strip(), tgt.strip()
                norm_src, norm_tgt = cleaner.normalize(src, tgt)
                for fh, text in zip(fhs, (src, tgt, norm_src, norm_tgt), strict=True):
                    fh.write(text + "\n")
                n += 1
            for fh in fhs:
                fh.close()
        self.progress(StageEvent("clean", "advance", f"clean {split}", advance=n))
        return {"read": n, "kept": n, "dropped": {}}

    # stage 2: vocabulary

    def _vocab(self, state: _State) -> int:
        cfg = self.cfg
        clean = state.done["clean"]
        n = int(clean["splits"]["train"]["kept"])
        size = self.settings["vocab_size"]
        coverage = float(clean["character_coverage"])
        sides = [("src", "tgt")] if cfg.joint_vocab else [("src",), ("tgt",)]
        per_model_pairs = cfg.vocab_sample_lines // len(sides[0])
        chosen = sample_indices(n, per_model_pairs, cfg.seed)
        files: list[str] = []
        for group in sides:
            name = "spm.model" if cfg.joint_vocab else f"spm.{group[0]}.model"
            self.progress(StageEvent("vocab", "start", f"vocabulary {name}", len(chosen)))
            lines = sampled_lines(self.work, group, chosen)
            proto = train_vocab(lines, size, coverage, cfg.seed)
            atomic_write_bytes(self.out / name, proto)
            files.append(name)
            self.progress(StageEvent("vocab", "advance", f"vocabulary {name}", advance=len(chosen)))
            self.progress(StageEvent("vocab", "end", f"vocabulary {name}"))
        state.finish("vocab", {"files": files, "sample_pairs": len(chosen)})
        return len(chosen)

    # stage 3: binarize

    def _binarize(self, state: _State) -> int:
        cfg = self.cfg
        vocab_files = state.done["vocab"]["files"]
        src_proto = (self.out / vocab_files[0]).read_bytes()
        tgt_proto = (self.out / vocab_files[-1]).read_bytes()
        size = self.settings["vocab_size"]
        workers = cfg.workers or os.cpu_count() or 1
        state.done.setdefault("binarize", {})
        total = 0
        for split, stats in state.done["clean"]["splits"].items():
            if split in state.done["binarize"]:
                continue
            n = int(stats["kept"])
            label = f"binarize {split}"
            self.progress(StageEvent("binarize", "start", label, n))
            src_w = TokenStoreWriter(self.out / f"{split}.src", size)
            tgt_w = TokenStoreWriter(self.out / f"{split}.tgt", size)
            try:
                counts = encode_to_stores(
                    _read_pairs(self.work / f"{split}.src", self.work / f"{split}.tgt"),
                    src_w,
                    tgt_w,
                    src_proto,
                    tgt_proto,
                    size,
                    workers if n > POOL_MIN_PAIRS else 1,
                    self._advancer("binarize", label),
                )
            except BaseException:
                src_w.abort()
                tgt_w.abort()
                raise
            src_w.close()
            tgt_w.close()
            self.progress(StageEvent("binarize", "end", label))
            state.done["binarize"][split] = counts.as_dict()
            state.save()
            total += n
        return total

    def _advancer(self, stage: str, label: str) -> Callable[[int], None]:
        def advance(k: int) -> None:
            self.progress(StageEvent(stage, "advance", label, advance=k))

        return advance

    # stage 4: manifest

    def _manifest(self, state: _State) -> dict[str, Any]:
        clean = state.done["clean"]
        vocab_files = state.done["vocab"]["files"]
        names = list(vocab_files)
        for split in clean["splits"]:
            names += [f"{split}.{side}.{ext}" for side in ("src", "tgt") for ext in ("bin", "idx")]
            if split != "train":
                names += [f"{split}.src.txt", f"{split}.tgt.txt"]
        self.progress(StageEvent("manifest", "start", "checksums", len(names)))
        files = {}
        for name in sorted(names):
            files[name] = sha256_file(self.out / name)
            self.progress(StageEvent("manifest", "advance", "checksums", advance=1))
        splits = {}
        for split, counts in state.done["binarize"].items():
            splits[split] = dict(counts)
        manifest = {
            "format": DATA_FORMAT,
            "version": DATA_VERSION,
            "src": clean["src"],
            "tgt": clean["tgt"],
            "source": clean["source"],
            "settings": state.settings,
            "splits": {s: splits[s] for s in SPLITS if s in splits},
            "cleaning": {
                "train": clean["splits"]["train"],
                "bad_utf8_replaced": clean["bad_utf8_replaced"],
                "held_out_filtered": False,
            },
            "vocab": {
                "src_model": vocab_files[0],
                "tgt_model": vocab_files[-1],
                "joint": len(vocab_files) == 1,
                "size": self.settings["vocab_size"],
                "type": "sentencepiece-bpe",
                "sample_pairs": state.done["vocab"]["sample_pairs"],
                "character_coverage": clean["character_coverage"],
            },
            "versions": _versions(),
            "files": files,
        }
        atomic_write_text(self.out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        self.progress(StageEvent("manifest", "end", "checksums"))
        return manifest


# --- helpers -------------------------------------------------------------------------------


def _our_names() -> set[str]:
    names = {MANIFEST, WORK, "spm.model", "spm.src.model", "spm.tgt.model"}
    for split in SPLITS:
        for side in ("src", "tgt"):
            names |= {f"{split}.{side}.bin", f"{split}.{side}.idx", f"{split}.{side}.txt"}
    return names


def _compare_settings(out: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    diffs = [
        f"{key} {before.get(key)!r} -> {now.get(key)!r}"
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    ]
    if diffs:
        raise NmtError(
            f"{out} was prepared with other settings ({'; '.join(diffs)}); "
            "rerun with --force to prepare it again, or choose another --out"
        )


def _versions() -> dict[str, str]:
    out = {"nmt": __version__}
    for package in ("sentencepiece", "sacremoses", "datasets", "numpy"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


def _read_pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    with (
        open(src, encoding="utf-8", newline="\n") as fs,
        open(tgt, encoding="utf-8", newline="\n") as ft,
    ):
        for a, b in zip(fs, ft, strict=True):
            yield a.rstrip("\n"), b.rstrip("\n")
