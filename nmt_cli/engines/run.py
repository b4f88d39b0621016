"""`nmt run`: one recipe, every stage, in order, resumable after any interruption.

prepare -> train -> average -> translate -> score, then the training curves
(curves-steps/curves-time .png/.svg in the run directory, when matplotlib is installed).
Each stage either finds its output
complete and skips, or (re)does its work: prepare skips its finished stages, train resumes
from the run's last checkpoint (its time budget counts across restarts), and average,
translate and score write their outputs atomically, so a file that exists is complete.

The test set is translated three times, so the table shows what averaging buys: with the
averaged model (the paper's final model), the best checkpoint by dev loss, and the last.

A parsing recipe (`score.metric = "trees"`, data from a `ptb` preset) is scored as the
paper's section 6.3 is: each output (a linearized tree) is turned back into a tree over
the source words, written beside it (test.<system>.trees), and scored by EVALB's
COLLINS.prm against the gold trees (trees/).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.config import RecipeConfig
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.files import atomic_write_text
from nmt_cli.core.parameters import count_parameters
from nmt_cli.data_dir import MANIFEST, open_data_dir
from nmt_cli.engines.average import average_checkpoints, select_last
from nmt_cli.engines.pictures.backend import require_plotting
from nmt_cli.engines.pictures.curves import curve_files, write_curves
from nmt_cli.engines.prepare import Progress, prepare, prepare_from_data_config
from nmt_cli.engines.score import ScoreSettings, mostly_empty, require_sacremoses, score_lines
from nmt_cli.engines.train import EventSink, TrainOptions, train
from nmt_cli.engines.training_log import METRICS, read_run_log
from nmt_cli.engines.translate.loading import set_threads
from nmt_cli.engines.translate.translator import translate_lines
from nmt_cli.errors import Interrupted, NmtError, UsageError
from nmt_cli.optional import MissingPackage
from nmt_cli.text_io import read_lines
from nmt_cli.trees.scoring import score_trees

STAGES = ("prepare", "train", "average", "translate", "score")
RESULTS = "results.json"


@dataclass(frozen=True)
class RunOptions:
    from_stage: str = "prepare"
    until_stage: str = "score"
    gpus: int = 0
    procs: int | None = None  # None: nmt train's choice (engines/train/layout.py)

    def __post_init__(self) -> None:
        for name in (self.from_stage, self.until_stage):
            if name not in STAGES:
                raise UsageError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
        if STAGES.index(self.from_stage) > STAGES.index(self.until_stage):
            raise UsageError(f"--from {self.from_stage} comes after --until {self.until_stage}")

    def runs(self, stage: str) -> bool:
        return (
            STAGES.index(self.from_stage) <= STAGES.index(stage) <= STAGES.index(self.until_stage)
        )


@dataclass(frozen=True)
class StageNotice:
    """What the run tells its caller as it moves from stage to stage."""

    stage: str
    status: str  # "start", "done"
    detail: str = ""


@dataclass(frozen=True)
class SystemScore:
    """One translated test set: which model produced it and how it scores."""

    system: str  # "averaged (last N)", "best (dev loss)", "last"
    checkpoint: str
    bleu: float
    bleu_signature: str
    paper_bleu: float | None
    paper_bleu_signature: str | None
    chrf: float
    empty_lines: int = 0  # when most of the output is empty (see score.mostly_empty), else 0
    lines: int = 0


@dataclass(frozen=True)
class ParseScore:
    """One parsed test set (section 6.3): EVALB's figures (COLLINS.prm) for one system."""

    system: str
    checkpoint: str
    f1: float  # labelled bracket F1 over all sentences, as Table 4 reports it
    recall: float
    precision: float
    complete_match: float
    f1_short: float  # sentences of at most `cutoff_len` words
    cutoff_len: int
    tagging_accuracy: float | None  # None: the outputs carry no POS tags (leaves: XX or words)
    error_sentences: int  # left out by EVALB (words differ from the gold tree's)
    repaired: int  # outputs that were not well-formed trees, repaired by the stated rules
    repairs: dict[str, int]  # outputs each repair rule applied to
    lines: int
    signature: str
    trees: str  # the outputs as bracketed trees, the file that was scored


@dataclass
class RunResult:
    recipe: str
    run_dir: str
    src: str
    tgt: str
    steps: int = 0
    train_seconds: float = 0.0
    parameters: int = 0
    train_flops: float = 0.0  # counted matrix products, forward + backward (core/flops.py)
    device_flops: float = 0.0  # the paper's Table 2 estimate: time x devices x device rate
    dev_ppl: float | None = None  # at the last validation
    systems: list[SystemScore] = field(default_factory=list)
    parses: list[ParseScore] = field(default_factory=list)  # parsing recipes instead

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def warnings(self) -> list[str]:
        """What the results table alone would hide: systems that output mostly nothing."""
        return [
            f"{s.system}: {s.empty_lines:,} of {s.lines:,} translations are empty, so its "
            f"scores mean little; the model is probably undertrained ({self.steps:,} steps)"
            for s in self.systems
            if s.empty_lines
        ] + [
            f"{p.system}: {p.repaired:,} of {p.lines:,} outputs were not well-formed trees "
            f"and were repaired, so its F1 means little; the model is probably undertrained "
            f"({self.steps:,} steps)"
            for p in self.parses
            if p.repaired > p.lines / 2
        ]


@dataclass(frozen=True)
class RunHooks:
    """Callbacks for the caller's display; all optional."""

    stage: Callable[[StageNotice], None] = lambda notice: None
    prepare: Progress | None = None
    train: EventSink | None = None


def run_recipe(
    recipe: RecipeConfig, options: RunOptions | None = None, hooks: RunHooks | None = None
) -> RunResult:
    options = options or RunOptions()
    hooks = hooks or RunHooks()
    run_dir = Path(recipe.train.run_dir)
    result = RunResult(recipe.name, str(run_dir), recipe.data.src, recipe.data.tgt)
    if options.runs("score") and recipe.score.metric == "bleu" and recipe.score.paper_bleu:
        require_sacremoses()  # before hours of training, not at the last stage

    def stage(name: str, work: Callable[[], str]) -> None:
        if not options.runs(name):
            return
        hooks.stage(StageNotice(name, "start"))
        hooks.stage(StageNotice(name, "done", work()))

    stage("prepare", lambda: _prepare(recipe, hooks))
    _check_metric(recipe)
    stage("train", lambda: _train(recipe, options, hooks))
    systems = _systems(recipe, run_dir)
    stage("average", lambda: _average(recipe, run_dir))
    stage("translate", lambda: _translate(recipe, run_dir, systems))
    if options.runs("score"):
        hooks.stage(StageNotice("score", "start"))
        _score(recipe, run_dir, systems, result)
        _training_facts(run_dir, result)
        record = {**result.to_dict(), "warnings": result.warnings()}
        atomic_write_text(run_dir / RESULTS, json.dumps(record, indent=2) + "\n")
        hooks.stage(StageNotice("score", "done", str(run_dir / RESULTS)))
    if options.runs("train") or STAGES.index(options.from_stage) > STAGES.index("train"):
        hooks.stage(StageNotice("plot", "done", _plot(run_dir)))
    return result


def _plot(run_dir: Path) -> str:
    """Training curves into the run directory; a notice, never a failure, without
    matplotlib (the run itself succeeded)."""
    metrics = run_dir / METRICS
    if not metrics.is_file():
        return f"no {METRICS}, no training curves"
    since = metrics.stat().st_mtime
    if all(p.is_file() and p.stat().st_mtime >= since for p in curve_files(run_dir)):
        return "training curves up to date"  # a rerun after training: seconds saved
    try:
        require_plotting()
    except MissingPackage as exc:
        return f"no training curves: {exc}"
    written = write_curves([read_run_log(run_dir)], run_dir)
    return "wrote " + ", ".join(p.name for p in written)


def _prepare(recipe: RecipeConfig, hooks: RunHooks) -> str:
    done = prepare(prepare_from_data_config(recipe.data), hooks.prepare)
    return "up to date" if done.up_to_date else f"wrote {done.out}"


class RunInterrupted(Interrupted):
    """Training stopped on a signal: the later stages must not run on a partial model
    (exit 128 + the signal, as `nmt train`)."""


def _train(recipe: RecipeConfig, options: RunOptions, hooks: RunHooks) -> str:
    done = train(recipe, TrainOptions(gpus=options.gpus, procs=options.procs), hooks.train)
    if done.stopped_by == "signal":
        raise RunInterrupted(
            f"training interrupted by signal {done.signal} at step {done.steps:,} "
            "(checkpoint saved); rerun the same command to continue",
            done.signal or signal.SIGINT,
        )
    return f"{done.steps:,} steps, stopped by {done.stopped_by}"


def _systems(recipe: RecipeConfig, run_dir: Path) -> dict[str, Path]:
    """Label -> checkpoint of each system the test set is translated with."""
    n = recipe.decode.average_last
    ckpts = run_dir / "checkpoints"
    return {
        f"averaged (last {n})": run_dir / "average.pt",
        "best (dev loss)": ckpts / "best.pt",
        "last": ckpts / "last.pt",
    }


def _hyp_path(run_dir: Path, label: str) -> Path:
    return run_dir / f"test.{label.split()[0]}.hyp"


def _up_to_date(output: Path, inputs: list[Path]) -> bool:
    """An output is current when it exists and is newer than everything it was made from
    (outputs are written atomically, so one that exists is complete)."""
    return output.is_file() and all(
        output.stat().st_mtime >= p.stat().st_mtime for p in inputs if p.is_file()
    )


def _average(recipe: RecipeConfig, run_dir: Path) -> str:
    out = run_dir / "average.pt"
    inputs = select_last(run_dir, recipe.decode.average_last)
    if _up_to_date(out, inputs):
        return "up to date"
    done = average_checkpoints(inputs, out)
    return f"averaged steps {', '.join(map(str, done.steps))} into {out}"


def _translate(recipe: RecipeConfig, run_dir: Path, systems: dict[str, Path]) -> str:
    data = open_data_dir(recipe.data.dir)
    source = data.raw_text("test", "src")
    if not source.is_file():
        raise NmtError(f"{data.root}: no raw test text ({source.name}); rerun nmt prepare")
    lines = read_lines(source)
    _, workers = set_threads(recipe.decode.threads, recipe.decode.workers)
    wrote = []
    for label, ckpt_path in systems.items():
        out = _hyp_path(run_dir, label)
        if not ckpt_path.is_file() or _up_to_date(out, [ckpt_path]):
            continue
        hyps = translate_lines(load_checkpoint(ckpt_path), lines, recipe.decode, workers=workers)
        atomic_write_text(out, "".join(h + "\n" for h in hyps))
        wrote.append(out.name)
    return f"{len(lines):,} sentences -> {', '.join(wrote) or 'up to date'}"


def _check_metric(recipe: RecipeConfig) -> None:
    """Trees are scored as trees and text as text: a recipe whose data directory holds
    the other kind is refused before training, naming the setting."""
    if not (Path(recipe.data.dir) / MANIFEST).is_file():
        return  # the stages that need it say so
    source = open_data_dir(recipe.data.dir).manifest.get("source", {})
    trees = source.get("kind") == "treebank"
    if trees and recipe.score.metric != "trees":
        raise NmtError(
            f"{recipe.data.dir} holds parse trees ({source.get('name', 'a treebank')}): "
            'set score.metric = "trees" in the recipe (--set score.metric=trees)'
        )
    if not trees and recipe.score.metric == "trees":
        raise NmtError(
            f'score.metric = "trees" needs a data directory of parse trees (nmt prepare '
            f"ptb or ptb-sample); {recipe.data.dir} holds translations"
        )


def _score(
    recipe: RecipeConfig, run_dir: Path, systems: dict[str, Path], result: RunResult
) -> None:
    if recipe.score.metric == "trees":
        _score_parses(recipe, run_dir, systems, result)
        return
    data = open_data_dir(recipe.data.dir)
    refs = read_lines(data.raw_text("test", "tgt"))
    settings = ScoreSettings(paper=recipe.score.paper_bleu, lang=data.tgt_lang)
    for label, ckpt_path in systems.items():
        hyp_path = _hyp_path(run_dir, label)
        if not hyp_path.is_file():
            continue
        hyps = read_lines(hyp_path)
        scores = score_lines(hyps, [refs], settings, names=[str(hyp_path), "reference"])
        paper = scores.paper_bleu
        result.systems.append(
            SystemScore(
                system=label,
                checkpoint=str(ckpt_path),
                bleu=scores.bleu.score,
                bleu_signature=scores.bleu.signature,
                paper_bleu=paper.score if paper else None,
                paper_bleu_signature=paper.signature if paper else None,
                chrf=scores.get("chrF2").score,
                empty_lines=mostly_empty(hyps),
                lines=len(hyps),
            )
        )
    if not result.systems:
        raise NmtError(f"{run_dir}: no translations to score; run the translate stage first")


def _score_parses(
    recipe: RecipeConfig, run_dir: Path, systems: dict[str, Path], result: RunResult
) -> None:
    """Each system's linearized outputs as trees over the test sentences' words, scored
    by EVALB against the gold trees (the data directory's raw target text)."""
    data = open_data_dir(recipe.data.dir)
    gold = data.raw_text("test", "tgt")
    refs = read_lines(gold)
    words = read_lines(data.raw_text("test", "src"))
    for label, ckpt_path in systems.items():
        hyp_path = _hyp_path(run_dir, label)
        if not hyp_path.is_file():
            continue
        scores = score_trees(
            read_lines(hyp_path), refs, words, [str(hyp_path), str(gold), "source"]
        )
        trees = hyp_path.with_suffix(".trees")
        atomic_write_text(trees, "".join(t + "\n" for t in scores.trees))
        result.parses.append(
            ParseScore(
                system=label,
                checkpoint=str(ckpt_path),
                f1=scores.all.f1,
                recall=scores.all.recall,
                precision=scores.all.precision,
                complete_match=scores.all.complete_match,
                f1_short=scores.short.f1,
                cutoff_len=scores.cutoff_len,
                tagging_accuracy=scores.all.tagging_accuracy,
                error_sentences=scores.all.error_sentences,
                repaired=scores.repaired,
                repairs=scores.repairs,
                lines=scores.lines,
                signature=scores.signature,
                trees=str(trees),
            )
        )
    if not result.parses:
        raise NmtError(f"{run_dir}: no parses to score; run the translate stage first")


def _training_facts(run_dir: Path, result: RunResult) -> None:
    last = run_dir / "checkpoints" / "last.pt"
    if last.is_file():
        ckpt = load_checkpoint(last)
        state = ckpt.train_state or {}
        result.steps = ckpt.step
        result.train_seconds = float(state.get("elapsed_s", 0.0))
        result.train_flops = float(state.get("train_flops", 0.0))
        result.device_flops = float(state.get("device_flops", 0.0))
        result.parameters = count_parameters(ckpt.build_model())
    result.dev_ppl = last_dev_ppl(run_dir)


def last_dev_ppl(run_dir: Path) -> float | None:
    """The dev perplexity of the run's last validation (metrics.jsonl), if any."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    ppl = None
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("type") == "valid" and "dev_ppl" in record:
            ppl = float(record["dev_ppl"])
    return ppl
