"""`nmt translate --ray`: a corpus translated on a Ray cluster, with Ray Data's batch
inference rather than a scheduler of our own.

The input is read here, on the machine that starts the job, by the text policy
(`corpus_input`), cut into the blocks `nmt translate` would read as chunks and put in
Ray's object store; the blocks form a Ray dataset (`from_arrow_refs`, one row a block).
`map_batches` hands them, one at a time, to a fixed pool of actors, each holding one
`BlockTranslator` (`block_worker`: one Translator with its threads, precision and
kernels chosen on its node, and the command's own output formats). Answers come back in
any order and each is written at once as its block's part (`corpus_parts`), read in
this process so that a stop leaves no Ray Data thread running (`ray_reading`); when all
are in, the parts are joined in input order into `--output`, or described by a manifest
when `--output` is a directory of parts. Ray Data restarts an actor that dies and gives its
blocks to it again (`max_restarts`/`max_task_retries`, its defaults for actor pools);
since a part is named by its block, a block translated twice is written once. A stopped
job leaves its parts and journal, and `--resume` sends only the blocks still missing.

Only the checkpoints must be readable at the same path on every node (shared storage);
the text travels through the object store, and the output is written by this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.block_worker import (
    BLOCK,
    DATA,
    FIRST_LINE,
    LINES,
    RECORD,
    BlockTranslator,
    WorkerSpec,
)
from nmt_cli.engines.translate.corpus_input import Block, Corpus, files_identity
from nmt_cli.engines.translate.corpus_parts import BlockRecord, PartsDir, in_order
from nmt_cli.engines.translate.ray_errors import connect_error, user_error
from nmt_cli.engines.translate.ray_reading import read_blocks
from nmt_cli.engines.translate.stream import Progress, TranslateStats, truncation_warning
from nmt_cli.errors import Interrupted, UsageError
from nmt_cli.optional import require
from nmt_cli.outputs import check_output_dir, check_output_path, is_stdout, open_output
from nmt_cli.text_io import LineDecoder, check_readable, display_name

# Settings that change where and how fast blocks are decoded, not what they say: a
# resumed job may run on another cluster.
_LAYOUT_SETTINGS = ("threads", "workers", "average_last")


@dataclass(frozen=True)
class RayJob:
    """A corpus translation on Ray. `cfg.threads` are each actor's (0: one) and
    `cfg.workers` the number of actors (0: as many as the cluster's CPUs hold, or one a
    GPU), `cfg.buffer_lines` the lines of a block."""

    models: tuple[Path, ...]
    cfg: DecodeConfig
    inputs: tuple[Path, ...] = (Path("-"),)
    output: Path | None = None  # None or `-`: stdout
    parts: bool = False  # `output` is a directory of parts with a manifest
    resume: bool = False
    address: str | None = None  # None: RAY_ADDRESS, this machine's cluster, or a new one
    as_json: bool = False
    alignment_layer: int | None = None  # 0: the default layer; None: no alignments
    on_bad_utf8: str = "error"
    ray_logs: bool = False  # Ray's own log lines and its workers' output on stderr

    @property
    def threads(self) -> int:
        return self.cfg.threads or 1


@dataclass(frozen=True)
class CorpusReport:
    """What `translate_on_ray` did, for the command to tell."""

    lines: int
    records: list[BlockRecord]  # every block, in input order
    translated: set[int]  # the blocks this run translated (the others were written before)
    seconds: float
    startup_seconds: float  # from the start until the first block was back
    actors: int
    threads: int
    beam: int
    replaced: str  # the text policy's warning about bytes that were not text, or ""

    def warnings(self) -> list[str]:
        """Replaced bytes, truncated lines, why a node decoded on the Python step."""
        out = [self.replaced] if self.replaced else []
        truncated = [r for r in self.records if r.truncated]
        if truncated:
            stats = TranslateStats(
                truncated=sum(r.truncated for r in truncated),
                truncated_lines=[n for r in truncated for n in r.truncated_lines][:5],
            )
            out.append(truncation_warning(stats, truncated[0].max_source))
        notes = dict.fromkeys(n for r in self.records for n in r.notes)
        out.extend(f"decoding with the slower Python step: {note}" for note in notes)
        return out

    def summary(self) -> str:
        new = [r for r in self.records if r.block in self.translated]
        lines = sum(r.lines for r in new)
        tokens = sum(r.target_tokens for r in new)
        rate = 1 / self.seconds if self.seconds > 0 else 0.0
        nodes = {r.node: r.precision for r in new}
        kept = len(self.records) - len(new)
        return (
            f"translated {lines:,} lines in {self.seconds:.2f}s on Ray "
            f"({lines * rate:.1f} sent/s, {tokens * rate:.0f} tok/s; beam {self.beam}, "
            f"{_precisions(nodes)}, {self.actors} actor(s) x {self.threads} thread(s) on "
            f"{len(nodes)} node(s); first block back after {self.startup_seconds:.1f}s)"
            + (f"; {kept:,} of {len(self.records):,} blocks were already written" if kept else "")
        )


def translate_on_ray(
    job: RayJob,
    *,
    on_block: Callable[[BlockRecord], None] | None = None,
    progress: Callable[[int | None], AbstractContextManager[Progress]] | None = None,
) -> CorpusReport:
    """Translate `job.inputs` on the Ray cluster at `job.address` into `job.output`, as
    `nmt translate` would on one machine (the same bytes, when the nodes resolve the
    precision alike). `on_block` is told of every block written; `progress(lines to
    translate)` of the lines in it. Raises NmtError for what a user can fix."""
    start = time.perf_counter()
    _check(job)
    ray = _import_ray()
    corpus = Corpus(job.inputs, LineDecoder(job.on_bad_utf8))
    root, temporary = _parts_root(job)
    suffix = ".jsonl" if job.as_json else ".txt"
    parts = PartsDir(root, _job_record(job, corpus), suffix, "--output")
    try:
        with parts.opened(job.resume):
            run = _Run(ray, job, parts, parts.done(), on_block, start)
            try:
                lines = run.translate(corpus, progress)
            except KeyboardInterrupt:
                raise _stopped(parts, temporary) from None
            except BaseException:
                if not job.parts and not parts.done():
                    parts.remove()  # a staging area with nothing worth keeping
                raise
            ordered = in_order(run.records, lines)
            _finish(job, parts, ordered, corpus)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    return CorpusReport(
        lines=lines,
        records=ordered,
        translated=run.translated,
        seconds=time.perf_counter() - start,
        startup_seconds=run.startup_seconds,
        actors=run.actors,
        threads=job.threads,
        beam=job.cfg.beam_size,
        replaced=corpus.decoder.warning(),
    )


def _finish(job: RayJob, parts: PartsDir, ordered: list[BlockRecord], corpus: Corpus) -> None:
    """Every block is written: the manifest of a directory of parts, or the one output."""
    if job.parts:
        if not parts.finished:
            counts = zip(job.inputs, corpus.line_counts, strict=True)
            inputs = [{"path": display_name(p), "lines": n} for p, n in counts]
            parts.write_manifest(ordered, inputs)
        return
    with open_output(job.output) as sink:
        parts.concatenate(ordered, sink)
    parts.remove()


class _Run:
    """One run's work on the cluster: the blocks not yet written, through the actors."""

    def __init__(
        self,
        ray: ModuleType,
        job: RayJob,
        parts: PartsDir,
        records: dict[int, BlockRecord],
        on_block: Callable[[BlockRecord], None] | None,
        start: float,
    ) -> None:
        self.ray, self.job, self.parts, self.records = ray, job, parts, records
        self.on_block, self.start = on_block, start
        self.translated: set[int] = set()
        self.actors = 0
        self.startup_seconds = 0.0

    def translate(
        self,
        corpus: Corpus,
        progress: Callable[[int | None], AbstractContextManager[Progress]] | None,
    ) -> int:
        """Every block of `corpus` not yet written, written; returns the corpus's lines."""
        if self.parts.finished:
            return sum(r.lines for r in self.records.values())
        with _connected(self.ray, self.job):
            refs: list[Any] = []
            lines = todo = 0
            for block in corpus.blocks(self.job.cfg.buffer_lines):
                lines += len(block.lines)
                if block.index not in self.records:
                    refs.append(self.ray.put(_table(block)))
                    todo += len(block.lines)
            if not refs:
                return lines
            shown_progress = progress(todo) if progress else contextlib.nullcontext()
            with shown_progress as shown, read_blocks(self._translated(refs)) as tables:
                for table in tables:
                    for row in table.to_pylist():
                        self._written(row[RECORD], row[DATA], shown)
        return lines

    def _translated(self, refs: list[Any]) -> Any:
        """The dataset of the blocks' answers: the blocks mapped by the actor pool."""
        ray, job = self.ray, self.job
        actors, gpus = _layout(ray.cluster_resources(), job)
        self.actors = min(actors, len(refs))
        device = "cuda" if gpus else "cpu"  # a GPU actor sees its own GPU only, as cuda:0
        spec = WorkerSpec(
            models=tuple(str(p.resolve()) for p in job.models),
            cfg=dataclasses.replace(job.cfg, threads=job.threads, workers=1, device=device),
            as_json=job.as_json,
            alignment_layer=job.alignment_layer,
        )
        return ray.data.from_arrow_refs(refs).map_batches(
            BlockTranslator,
            fn_constructor_kwargs={"spec": spec},
            batch_size=1,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=self.actors),
            num_cpus=job.threads,
            num_gpus=gpus,
        )

    def _written(self, record_json: str, data: bytes, shown: Progress | None) -> None:
        record = BlockRecord(**json.loads(record_json))
        self.parts.write(record, data)
        if not self.translated:
            self.startup_seconds = time.perf_counter() - self.start
        self.records[record.block] = record
        self.translated.add(record.block)
        if shown is not None:
            shown.advance(record.lines)
        if self.on_block is not None:
            self.on_block(record)


def _import_ray() -> ModuleType:
    """Ray with Ray Data, or the one line that says which extra brings them."""
    require("ray.data", purpose="nmt translate --ray", avoid="leave out --ray")
    import ray

    return ray


def _check(job: RayJob) -> None:
    """What can be refused before Ray is started: inputs, models, the output, --resume."""
    for path in (*job.inputs, *job.models):
        check_readable(path)
    stdin = any(str(p) == "-" for p in job.inputs)
    if stdin and len(job.inputs) > 1:
        raise UsageError("--input -: stdin is read alone, not with other inputs")
    if job.parts:
        if is_stdout(job.output):
            raise UsageError("--parts names the directory to write with --output DIR")
        assert job.output is not None
        check_output_dir(job.output, "--output")
    else:
        check_output_path(job.output, inputs=[*job.models, *job.inputs])
    if job.resume and stdin:
        raise UsageError("--resume reads the input again: give --input FILE, not stdin")
    if job.resume and is_stdout(job.output):
        raise UsageError("--resume continues the parts of an --output: give --output")


def _parts_root(job: RayJob) -> tuple[Path, bool]:
    """Where the parts go, and whether that place is temporary (output to stdout)."""
    if job.parts:
        assert job.output is not None
        return job.output, False
    if is_stdout(job.output):
        return Path(tempfile.mkdtemp(prefix="nmt-translate-parts-")), True
    assert job.output is not None
    return job.output.with_name(job.output.name + ".parts"), False


def _job_record(job: RayJob, corpus: Corpus) -> dict[str, Any]:
    """What `--resume` must find unchanged: inputs, checkpoints, settings, format."""
    settings = dataclasses.asdict(job.cfg)
    return {
        "inputs": corpus.fingerprint() if corpus.resumable else [],
        "models": files_identity(job.models),
        "decode": {k: v for k, v in settings.items() if k not in _LAYOUT_SETTINGS},
        "json": job.as_json,
        "alignment_layer": job.alignment_layer,
    }


def _layout(resources: dict[str, float], job: RayJob) -> tuple[int, int]:
    """(actors, GPUs each): `--workers` actors, or as many as the cluster holds; on GPUs
    (`--device cuda`, or `auto` on a cluster that has some) one GPU each."""
    device = job.cfg.device
    gpus = int(device.startswith("cuda") or (device == "auto" and resources.get("GPU", 0) >= 1))
    if job.cfg.workers:
        return job.cfg.workers, gpus
    if gpus:
        return max(1, int(resources.get("GPU", 1))), gpus
    return max(1, int(resources.get("CPU", 1) // job.threads)), 0


@contextlib.contextmanager
def _connected(ray: ModuleType, job: RayJob) -> Iterator[None]:
    """Connected to the cluster for the block, unless the caller already is; Ray's
    errors for work that a user can fix become theirs (`ray_errors.user_error`)."""
    _configure(ray.data.DataContext.get_current(), quiet=not job.ray_logs)
    if ray.is_initialized():
        with _user_errors():
            yield
        return
    try:
        ray.init(
            address=job.address,
            logging_level=logging.INFO if job.ray_logs else logging.ERROR,
            log_to_driver=job.ray_logs,
        )
    except Exception as exc:
        raise connect_error(job.address, exc) from None
    try:
        with _user_errors():
            yield
    finally:
        ray.shutdown()


def _configure(context: Any, quiet: bool) -> None:
    """Ray Data raises a block's own error (a bad checkpoint's NmtError), not its wrapper
    (`UserCodeException`, which loses it on the way from the node). Its own lines on the
    console (execution plans, timings, progress bars, the tracebacks of errors the
    command reports in one line) only under --verbose; its log files keep them."""
    context.raise_original_map_exception = True
    if not quiet:
        return
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.CRITICAL)  # a failure is raised, and told once


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        error = user_error(exc)
        if error is None:
            raise
        raise error from None


def _stopped(parts: PartsDir, temporary: bool) -> Interrupted:
    """Ctrl-C: what is written stays, and how to go on."""
    if temporary:
        return Interrupted("interrupted")
    return Interrupted(
        f"interrupted; the {len(parts.done()):,} block(s) written stay in {parts.root}: "
        "rerun with --resume to translate the rest"
    )


def _table(block: Block) -> Any:
    """A block as a one-row PyArrow table, the unit of the dataset."""
    import pyarrow as pa

    return pa.table({BLOCK: [block.index], FIRST_LINE: [block.first_line], LINES: [block.lines]})


def _precisions(nodes: dict[str, str]) -> str:
    """ "bf16", or per precision the nodes that chose it where they differ."""
    chosen = sorted(set(nodes.values()))
    if len(chosen) <= 1:
        return chosen[0] if chosen else "no blocks"
    return ", ".join(f"{p} on {sum(v == p for v in nodes.values())} node(s)" for p in chosen)
