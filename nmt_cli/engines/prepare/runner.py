"""`prepare()`: run or resume the four stages in order, and report what each one did.

The runner owns the decisions between stages: whether the directory is already complete
(then only check it), whether it may be written into at all, which recorded stages still
stand, and which must run. The stages themselves (cleaning.py, vocabulary.py,
binarize.py, manifest.py) are functions of their inputs that know nothing of resuming.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from nmt_cli.data_dir import MANIFEST, open_data_dir
from nmt_cli.dir_lock import DirLock
from nmt_cli.engines.prepare.binarize import BinarizeInputs, EncodeCounts, binarize
from nmt_cli.engines.prepare.cleaning import Cleaned, CleanInputs, clean
from nmt_cli.engines.prepare.config import PrepareConfig
from nmt_cli.engines.prepare.layout import Layout
from nmt_cli.engines.prepare.manifest import ManifestInputs, write_manifest
from nmt_cli.engines.prepare.presets import preset_names
from nmt_cli.engines.prepare.progress import STAGES, Progress, StageEvent, no_progress
from nmt_cli.engines.prepare.sources import Corpus, resolve_corpus
from nmt_cli.engines.prepare.state import PrepareState, refuse_other_heldout, refuse_other_settings
from nmt_cli.engines.prepare.vocabulary import (
    VocabInputs,
    build_vocabulary,
    model_vocabulary,
    write_vocabulary,
)
from nmt_cli.errors import NmtError

if TYPE_CHECKING:
    from nmt_cli.core.vocab import VocabPair


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


@dataclass
class _Reports:
    """The stage reports of one call, in order, with the skip events the caller sees."""

    progress: Progress
    stages: list[StageReport] = field(default_factory=list)

    def ran(self, stage: str, since: float, pairs: int) -> None:
        self.stages.append(StageReport(stage, True, time.perf_counter() - since, pairs))

    def skip(self, stage: str) -> None:
        self.progress(StageEvent(stage, "skip", f"{stage} (done before)"))
        self.stages.append(StageReport(stage, False, 0.0, 0))


def prepare(cfg: PrepareConfig, progress: Progress | None = None) -> PrepareResult:
    """Run (or resume) every stage that is not yet done; return the manifest and timings.

    One `nmt prepare` at a time per data directory: a second one is refused while the
    first holds the directory's lock (two runs would delete each other's work files).
    """
    layout = Layout(Path(cfg.out))
    if cfg.preset and cfg.preset not in preset_names():
        resolve_corpus(cfg.source_request())  # raises the "unknown corpus" error
    cfg, model_vocab = _with_model_vocabulary(cfg)
    if layout.out.exists() and not layout.out.is_dir():
        raise NmtError(f"{layout.out}: exists and is not a directory; choose another --out")
    created = not layout.out.exists()
    try:
        with DirLock(layout.lock_file, "nmt prepare", "--out"):
            return _prepare_locked(cfg, layout, progress or no_progress, model_vocab)
    except NmtError:
        if created:  # nothing of value was made: leave no directory behind
            shutil.rmtree(layout.out, ignore_errors=True)
        raise


def _with_model_vocabulary(cfg: PrepareConfig) -> tuple[PrepareConfig, VocabPair | None]:
    """With --vocab-from, the checkpoint's vocabulary, and the settings that describe it
    (its size, joint or not) in place of the ones a learned vocabulary would have."""
    if not cfg.vocab_from:
        return cfg, None
    vocab = model_vocabulary(cfg.vocab_from)
    if {vocab.src.kind, vocab.tgt.kind} != {"sentencepiece"}:
        raise NmtError(
            f"--vocab-from {cfg.vocab_from}: the model reads text with Moses and BPE "
            "(imported from fairseq); nmt prepare encodes with SentencePiece only"
        )
    size = max(len(vocab.src), len(vocab.tgt))
    if cfg.vocab_size not in (0, size) or (vocab.joint and not cfg.joint_vocab):
        raise NmtError(
            f"--vocab-from {cfg.vocab_from} gives the model's own vocabulary ({size:,} pieces, "
            f"{'joint' if vocab.joint else 'separate'}): drop --vocab-size and --separate-vocab"
        )
    return dataclasses.replace(cfg, vocab_size=size, joint_vocab=vocab.joint), vocab


def _prepare_locked(
    cfg: PrepareConfig, layout: Layout, progress: Progress, model_vocab: VocabPair | None
) -> PrepareResult:
    settings = cfg.settings()
    reports = _Reports(progress)
    if (layout.out / MANIFEST).is_file() and not cfg.force:
        return _up_to_date(cfg, layout, settings, reports)
    state = _resume(cfg, layout, settings)
    if state is not None:
        state.forget_missing(layout)
    corpus = None
    if state is None or state.cleaned is None:
        corpus = resolve_corpus(cfg.source_request())  # bad input fails before writing
    layout.work.mkdir(parents=True, exist_ok=True)
    layout.remove_temporaries()
    if state is None:
        state = PrepareState(layout.state_file, settings)
        state.save()
    return _run_stages(cfg, layout, state, corpus, reports, model_vocab)


def _resume(cfg: PrepareConfig, layout: Layout, settings: dict[str, Any]) -> PrepareState | None:
    """The state of an earlier run to continue, or None to start afresh (after any --force)."""
    state = PrepareState.load(layout.state_file)
    if state is not None:
        if cfg.force:
            layout.wipe()
            return None
        refuse_other_settings(layout.out, state.settings, settings)
        cleaned = state.cleaned
        if cleaned is not None:
            refuse_other_heldout(layout.out, cleaned.source, cfg.valid_split, cfg.test_split)
        return state
    if layout.out.is_dir() and any(layout.out.iterdir()) and not layout.only_ours():
        raise NmtError(
            f"{layout.out}: exists, is not empty and was not made by nmt prepare; "
            "choose a new or empty --out"
        )
    if cfg.force:
        layout.wipe()
    return None


def _run_stages(
    cfg: PrepareConfig,
    layout: Layout,
    state: PrepareState,
    corpus: Corpus | None,
    reports: _Reports,
    model_vocab: VocabPair | None = None,
) -> PrepareResult:
    """Each stage not recorded as done runs, and its result is recorded at once."""
    progress = reports.progress
    cleaned = _once(
        "clean", state.cleaned, state, reports,
        lambda: clean(_clean_inputs(cfg, corpus), layout, progress),
    )  # fmt: skip
    vocabulary = _once(
        "vocab", state.vocabulary, state, reports,
        lambda: (
            write_vocabulary(model_vocab, layout)
            if model_vocab is not None
            else build_vocabulary(_vocab_inputs(cfg, cleaned), layout, progress)
        ),
    )  # fmt: skip
    todo = {split: cleaned.kept(split) for split in cleaned.splits if split not in state.binarized}
    if todo:
        since = time.perf_counter()
        inputs = BinarizeInputs(todo, vocabulary, cfg.effective_vocab_size(), cfg.workers)

        def record(split: str, counts: EncodeCounts) -> None:
            state.finish_split(split, dataclasses.asdict(counts))

        reports.ran("binarize", since, binarize(inputs, layout, progress, record))
    else:
        reports.skip("binarize")

    since = time.perf_counter()
    done = ManifestInputs(state.settings, cleaned, vocabulary, state.binarized)
    manifest = write_manifest(done, layout, progress)
    reports.ran("manifest", since, 0)
    layout.remove_work()
    return PrepareResult(layout.out, manifest, reports.stages, up_to_date=False)


class _Recorded(Protocol):
    """A stage result the state file keeps: clean's `Cleaned`, vocab's `Vocabulary`."""

    @property
    def pairs(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Recorded)


def _once(
    stage: str, recorded: R | None, state: PrepareState, reports: _Reports, run: Callable[[], R]
) -> R:
    """The stage's recorded result, or run it (forgetting every later stage) and record it."""
    if recorded is not None:
        reports.skip(stage)
        return recorded
    since = time.perf_counter()
    state.redo(stage)
    result = run()
    state.finish(stage, result.to_json())
    reports.ran(stage, since, result.pairs)
    return result


def _clean_inputs(cfg: PrepareConfig, corpus: Corpus | None) -> CleanInputs:
    assert corpus is not None  # prepare() resolves it whenever clean is to run
    return CleanInputs(corpus, cfg.clean_rules(), cfg.max_pairs, cfg.sample_max_pairs, cfg.seed)


def _vocab_inputs(cfg: PrepareConfig, cleaned: Cleaned) -> VocabInputs:
    return VocabInputs(
        train_pairs=cleaned.kept("train"),
        size=cfg.effective_vocab_size(),
        character_coverage=float(cleaned.character_coverage),
        joint=cfg.joint_vocab,
        sample_lines=cfg.vocab_sample_lines,
        seed=cfg.seed,
        # a treebank's bracket tokens (engines/prepare/treebank.py), recorded with its source
        whole_words=tuple(cleaned.source.get("whole_words", ())),
    )


def _up_to_date(
    cfg: PrepareConfig, layout: Layout, settings: dict[str, Any], reports: _Reports
) -> PrepareResult:
    """A complete directory: check it was made with these settings and is unchanged."""
    data = open_data_dir(layout.out)
    refuse_other_settings(layout.out, data.manifest.get("settings", {}), settings)
    source = data.manifest.get("source", {})
    refuse_other_heldout(layout.out, source, cfg.valid_split, cfg.test_split)
    changed = data.changed_files()
    if changed:
        raise NmtError(
            f"{layout.out}: {', '.join(changed)} changed since it was prepared; "
            "rerun with --force to prepare it again"
        )
    layout.remove_work()  # left by a run killed after its manifest
    layout.remove_temporaries()
    for stage in STAGES:
        reports.skip(stage)
    return PrepareResult(layout.out, data.manifest, reports.stages, up_to_date=True)
