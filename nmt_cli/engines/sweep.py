"""`nmt sweep`: a grid of variants of one recipe, each a full `nmt run`, in the shape of
the paper's Table 3 ("Variations on the Transformer architecture", section 6.2).

A sweep file names a base recipe, overrides applied to every row, and the rows:

    [sweep]
    recipe = "multi30k-en-de.toml"       # relative to the sweep file
    runs_dir = "runs/table3-multi30k"    # one run directory per row below it
    set = ["train.max_steps=400"]        # every row
    [[sweep.rows]]
    name = "base"
    [[sweep.rows]]
    name = "A h=1"
    set = ["model.n_heads=1", "model.d_k=256", "model.d_v=256"]

The data is prepared once; then each row runs the run engine from its train stage
(`nmt run --from train`'s work) in a process of its own (`sweep_row.py`: spawned, given the
row's serialized recipe), `jobs` at a time (one per GPU, or the CPU cores shared out),
writing its log beside its run directory. A row whose results are complete is skipped,
and an interrupted row resumes from its last checkpoint, so rerunning the sweep carries
on where it stopped. Each row is scored as Table 3 is: dev perplexity at the last
validation, and dev and test BLEU of the last checkpoint with beam search (the paper
used no checkpoint averaging for Table 3). A sweep of a parsing recipe (`score.metric =
"trees"`) is scored as section 6.3 chose its settings: EVALB F1 (COLLINS.prm) of the
dev trees (section 22 for the WSJ) and of the test trees, by the same beam search.
"""

from __future__ import annotations

import json
import os
import queue
import re
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.config import ConfigError, RecipeConfig, load_recipe
from nmt_cli.core.files import atomic_write_text
from nmt_cli.cpus import usable_cpus
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.run import RESULTS, RunOptions, run_recipe
from nmt_cli.engines.score import ScoreSettings, score_lines
from nmt_cli.engines.sweep_row import DEV_HYP, RowJob, cuda_devices_for, run_row_process
from nmt_cli.errors import NmtError
from nmt_cli.text_io import read_lines
from nmt_cli.trees.scoring import score_trees

SWEEP_RESULTS = "sweep.json"


@dataclass(frozen=True)
class SweepRow:
    name: str
    overrides: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        """The row's run directory name: its name with anything unusual replaced."""
        return re.sub(r"[^A-Za-z0-9._=-]+", "_", self.name).strip("_") or "row"


@dataclass(frozen=True)
class SweepPlan:
    source: Path  # the sweep file
    recipe: Path  # the base recipe
    runs_dir: Path
    overrides: tuple[str, ...]  # applied to every row, before the row's own
    rows: tuple[SweepRow, ...]

    def row_overrides(self, row: SweepRow) -> list[str]:
        run_dir = self.runs_dir / row.slug
        return [*self.overrides, *row.overrides, f"train.run_dir={json.dumps(str(run_dir))}"]

    def row_recipe(self, row: SweepRow, extra: tuple[str, ...] = ()) -> RecipeConfig:
        return load_recipe(self.recipe, [*self.row_overrides(row), *extra])


@dataclass(frozen=True)
class SweepOptions:
    jobs: int = 0  # rows at once; 0 = one per GPU, or one per CPU core
    gpus: int = 0  # GPUs available to the sweep; each job trains on one
    extra_overrides: tuple[str, ...] = ()  # --set on the command line, for every row

    def __post_init__(self) -> None:
        if self.jobs < 0 or self.gpus < 0:
            raise NmtError("--jobs and --gpus must not be negative")


@dataclass
class RowResult:
    """One line of the table: the variant's settings and what it scored."""

    name: str
    run_dir: str
    encoder_layers: int
    decoder_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    d_k: int
    d_v: int
    dropout: float
    label_smoothing: float
    positions: str
    steps: int = 0
    parameters: int = 0
    dev_ppl: float | None = None
    metric: str = "bleu"  # the recipe's score.metric: "bleu", or "trees" for parsing
    beam: int = 0  # the recipe's beam search, which parsing rows may vary (section 6.3)
    length_penalty: float = 0.0
    dev_bleu: float | None = None
    test_bleu: float | None = None  # the last checkpoint, as Table 3
    test_bleu_averaged: float | None = None
    dev_f1: float | None = None  # parsing: labelled bracket F1, all sentences
    test_f1: float | None = None
    test_f1_averaged: float | None = None
    train_flops: float = 0.0
    device_flops: float = 0.0
    status: str = "pending"  # done, skipped (complete before), failed: ...


@dataclass
class SweepResult:
    plan: SweepPlan
    rows: list[RowResult] = field(default_factory=list)


def load_sweep(path: str | Path) -> SweepPlan:
    """Read and check a sweep file: every row's recipe must load before anything runs."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: no such sweep file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise NmtError(f"{path}: not a valid TOML file: {exc}") from None
    sweep = raw.get("sweep")
    if not isinstance(sweep, dict):
        raise NmtError(f"{path}: no [sweep] table; see recipes/sweeps/table3-multi30k.toml")
    unknown = set(sweep) - {"recipe", "runs_dir", "set", "rows", "description"}
    if unknown:
        raise NmtError(f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))}")
    recipe, runs_dir = sweep.get("recipe"), sweep.get("runs_dir")
    if not isinstance(recipe, str) or not isinstance(runs_dir, str):
        raise NmtError(f"{path}: sweep.recipe and sweep.runs_dir must be strings")
    rows_raw = sweep.get("rows")
    if not isinstance(rows_raw, list) or not rows_raw:
        raise NmtError(f"{path}: sweep.rows must list at least one [[sweep.rows]] table")
    rows = []
    for i, row in enumerate(rows_raw, start=1):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise NmtError(f"{path}: sweep row {i} needs a name")
        rows.append(SweepRow(row["name"], _strings(row.get("set", []), path, f"row {i} set")))
    slugs = [r.slug for r in rows]
    if len(set(slugs)) != len(slugs):
        raise NmtError(f"{path}: two rows share a run directory name; rename one")
    plan = SweepPlan(
        source=path,
        recipe=path.parent / recipe,
        runs_dir=Path(runs_dir),
        overrides=_strings(sweep.get("set", []), path, "sweep.set"),
        rows=tuple(rows),
    )
    for row in plan.rows:
        try:
            plan.row_recipe(row)
        except ConfigError as exc:
            raise NmtError(f"{path}: row {row.name!r}: {exc}") from None
    return plan


def _strings(value: Any, path: Path, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NmtError(f'{path}: {what} must be a list of "section.key=value" strings')
    return tuple(value)


Notify = Callable[[str, RowResult], None]


def with_overrides(plan: SweepPlan, extra: tuple[str, ...]) -> SweepPlan:
    """The plan with `--set` overrides of the command line after its own."""
    if not extra:
        return plan
    return SweepPlan(plan.source, plan.recipe, plan.runs_dir, (*plan.overrides, *extra), plan.rows)


def collect_sweep(plan: SweepPlan) -> SweepResult:
    """The table as it stands, running nothing: complete rows filled in, the rest pending."""
    result = SweepResult(plan, [_describe(plan, row) for row in plan.rows])
    for row, out in zip(plan.rows, result.rows, strict=True):
        recipe = plan.row_recipe(row)
        if _complete(Path(recipe.train.run_dir)):
            _collect(recipe, out)
            out.status = "done"
    return result


def run_sweep(
    plan: SweepPlan, options: SweepOptions | None = None, notify: Notify | None = None
) -> SweepResult:
    """Prepare once, run every row (skipping complete ones), and collect the table."""
    options = options or SweepOptions()
    plan = with_overrides(plan, options.extra_overrides)
    if options.gpus:  # the GPUs must be there before anything runs
        cuda_devices_for(0, options.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    first = plan.row_recipe(plan.rows[0])
    run_recipe(first, RunOptions(until_stage="prepare"))
    jobs, threads = _layout(options)
    result = SweepResult(plan, [_describe(plan, row) for row in plan.rows])
    slots: queue.Queue[int] = queue.Queue()  # GPU numbers (or CPU shares) free to take
    for slot in range(jobs):
        slots.put(slot)

    def work(index: int) -> None:
        row, out = plan.rows[index], result.rows[index]
        slot = slots.get()
        try:
            out.status = _run_row(plan, row, options, slot, threads)
            _collect(plan.row_recipe(row), out)
        except NmtError as exc:
            out.status = f"failed: {exc}"
        finally:
            slots.put(slot)
        if notify is not None:
            notify(row.name, out)

    pool = ThreadPoolExecutor(jobs)
    try:
        list(pool.map(work, range(len(plan.rows))))
    finally:  # on Ctrl-C the rows running stop (they save); the rows waiting never start
        pool.shutdown(wait=True, cancel_futures=True)
    write_results(result)
    return result


def _layout(options: SweepOptions) -> tuple[int, int]:
    """(rows at once, CPU threads per row)."""
    if options.gpus:
        return options.jobs or options.gpus, 1
    cores = usable_cpus()
    jobs = options.jobs or cores
    return jobs, max(1, cores // jobs)


def _describe(plan: SweepPlan, row: SweepRow) -> RowResult:
    recipe = plan.row_recipe(row)
    m = recipe.model
    return RowResult(
        name=row.name,
        run_dir=recipe.train.run_dir,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        d_model=m.d_model,
        d_ff=m.d_ff,
        n_heads=m.n_heads,
        d_k=m.head_dim_k,
        d_v=m.head_dim_v,
        dropout=m.dropout,
        label_smoothing=recipe.train.label_smoothing,
        positions=m.positions,
        metric=recipe.score.metric,
        beam=recipe.decode.beam_size,
        length_penalty=recipe.decode.length_penalty,
    )


def _run_row(plan: SweepPlan, row: SweepRow, options: SweepOptions, slot: int, threads: int) -> str:
    """`nmt run --from train`'s stages and the dev set's translation for one row, in a
    process of its own (see sweep_row.py); its output goes to a log beside the run
    directory. Returns the row's status."""
    extra = () if options.gpus else (f"train.threads={threads}", f"decode.threads={threads}")
    recipe = plan.row_recipe(row, extra)
    run_dir = Path(recipe.train.run_dir)
    if _complete(run_dir):
        return "skipped (complete)"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    job = RowJob(
        recipe=recipe.to_dict(),
        source=f"{plan.source}: row {row.name!r}",
        log=str(run_dir / "sweep.log"),
        gpus=1 if options.gpus else 0,
        threads=threads,
        cuda_devices=cuda_devices_for(slot, options.gpus, visible) if options.gpus else None,
    )
    failure = run_row_process(job)
    if failure is not None:
        raise NmtError(failure)
    return "done"


def _complete(run_dir: Path) -> bool:
    """A row is complete once `nmt run` wrote its results and the dev set is translated."""
    return (run_dir / RESULTS).is_file() and (run_dir / DEV_HYP).is_file()


def _collect(recipe: RecipeConfig, out: RowResult) -> None:
    """Fill a row from its run directory: results.json, the dev translation."""
    run_dir = Path(recipe.train.run_dir)
    results = json.loads((run_dir / RESULTS).read_text(encoding="utf-8"))
    out.steps = int(results.get("steps", 0))
    out.parameters = int(results.get("parameters", 0))
    out.dev_ppl = results.get("dev_ppl")
    out.train_flops = float(results.get("train_flops", 0.0))
    out.device_flops = float(results.get("device_flops", 0.0))
    for system in results.get("systems", []):
        if system["system"] == "last":
            out.test_bleu = float(system["bleu"])
        elif system["system"].startswith("averaged"):
            out.test_bleu_averaged = float(system["bleu"])
    for parse in results.get("parses", []):
        if parse["system"] == "last":
            out.test_f1 = float(parse["f1"])
        elif parse["system"].startswith("averaged"):
            out.test_f1_averaged = float(parse["f1"])
    data = open_data_dir(recipe.data.dir)
    refs = read_lines(data.raw_text("valid", "tgt"))
    hyps = read_lines(run_dir / DEV_HYP)
    if recipe.score.metric == "trees":
        words = read_lines(data.raw_text("valid", "src"))
        out.dev_f1 = score_trees(hyps, refs, words, ["dev", "ref", "dev source"]).all.f1
    else:
        settings = ScoreSettings(paper=False, lang=data.tgt_lang)
        out.dev_bleu = score_lines(hyps, [refs], settings, names=["dev", "ref"]).bleu.score


def write_results(result: SweepResult) -> Path:
    path = result.plan.runs_dir / SWEEP_RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"sweep": str(result.plan.source), "rows": [asdict(r) for r in result.rows]}
    atomic_write_text(path, json.dumps(body, indent=2) + "\n")
    return path
