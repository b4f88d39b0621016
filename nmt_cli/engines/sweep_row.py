"""One row of `nmt sweep` in a process of its own: the run engine on the row's serialized
recipe (train -> average -> translate -> score), then the dev set translated by the last
checkpoint, for Table 3's dev BLEU.

`run_row_process` starts the row with multiprocessing's "spawn" context, so each row has a
fresh interpreter: its own CUDA_VISIBLE_DEVICES (set before anything touches CUDA), its
own thread count and memory, and a crash of one row is that row's failure, not the
sweep's. Everything the row prints goes to its log beside its run directory; the parent
gets back one line, the reason a row failed. This module imports no torch at the top, so
the row's process sets its device mask before torch is loaded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.errors import NmtError

if TYPE_CHECKING:
    from nmt_cli.config import RecipeConfig
    from nmt_cli.engines.run import StageNotice
    from nmt_cli.engines.train.events import TrainEvent

DEV_HYP = "dev.last.hyp"  # the dev set translated by the last checkpoint


@dataclass(frozen=True)
class RowJob:
    """What a row's process needs, as plain data (it crosses to a spawned interpreter)."""

    recipe: dict[str, Any]  # RecipeConfig.to_dict(), rebuilt and checked again in the row
    source: str  # where the recipe came from, for messages
    log: str  # the row's log file, appended to
    gpus: int = 0  # 0: train on the CPU; 1: on the one GPU `cuda_devices` leaves visible
    threads: int = 1  # CPU threads of the dev set's translation
    cuda_devices: str | None = None  # the process's CUDA_VISIBLE_DEVICES; None: inherited


def cuda_devices_for(slot: int, gpus: int, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES of the job in `slot` (0..jobs-1), among `gpus` GPUs: an index
    into the mask the user or a scheduler already set (CUDA_VISIBLE_DEVICES="4,5,6,7"
    gives slot 0 device "4"), or device `slot` itself when no mask is set. More jobs than
    GPUs share them in turn."""
    if gpus < 1:
        raise ValueError("cuda_devices_for needs at least one GPU")
    index = slot % gpus
    if visible is None:
        return str(index)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if len(devices) < gpus:
        raise NmtError(
            f"--gpus {gpus} asked for, but CUDA_VISIBLE_DEVICES={visible!r} makes "
            f"{len(devices)} GPU(s) visible"
        )
    return devices[index]


def run_row_process(job: RowJob) -> str | None:
    """Run `job` in a spawned process and wait for it: None when it succeeded, otherwise
    the reason it failed, in one line (the details are in its log)."""
    spawn = mp.get_context("spawn")
    reader, writer = spawn.Pipe(duplex=False)
    proc = spawn.Process(target=_row_main, args=(job, writer), daemon=False)
    proc.start()
    writer.close()  # the row's end: reading sees EOF if the row dies without a word
    try:
        reason: str | None = reader.recv()
    except EOFError:
        proc.join()
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited with {code}"
        reason = f"the row's process {how}"
    finally:
        reader.close()
    proc.join()
    return None if reason is None else f"{reason}; see {job.log}"


def _row_main(job: RowJob, report: Connection) -> None:
    """The row's process: set its devices, send its output to its log, run it, and report
    None or the reason it failed."""
    if job.cuda_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = job.cuda_devices
    _log_to(Path(job.log))
    print(f"== nmt sweep row, {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    reason: str | None = None
    try:
        run_row(job)
    except NmtError as exc:
        reason = str(exc)
    except KeyboardInterrupt:
        reason = "interrupted"
    except Exception as exc:  # a bug: its traceback goes to the log, one line to the table
        traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"internal error ({type(exc).__name__}{': ' + first if first else ''})"
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr, flush=True)
    report.send(reason)
    report.close()


def _log_to(log: Path) -> None:
    """Everything this process writes to stdout and stderr, its libraries' output
    included, goes to the end of `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_row(job: RowJob) -> None:
    """The row's work, in this process: `nmt run --from train`'s stages, then the dev set."""
    from nmt_cli.config import recipe_from_dict
    from nmt_cli.engines.run import RunHooks, RunOptions, run_recipe

    recipe = recipe_from_dict(job.recipe, source=job.source)
    hooks = RunHooks(stage=_print_stage, train=_print_notice)
    run_recipe(recipe, RunOptions(from_stage="train", gpus=job.gpus), hooks)
    print("-- dev set", flush=True)
    print(f"dev set: translated into {translate_dev(recipe, job.threads)}", flush=True)


def _print_stage(notice: StageNotice) -> None:
    if notice.status == "start":
        print(f"-- {notice.stage}", flush=True)
    elif notice.detail:
        print(f"{notice.stage}: {notice.detail}", flush=True)


def _print_notice(event: TrainEvent) -> None:
    from nmt_cli.engines.train.events import CheckpointSaved, Notice

    if isinstance(event, Notice):
        print(("warning: " if event.warning else "") + event.text, flush=True)
    elif isinstance(event, CheckpointSaved):
        ppl = "" if event.dev_ppl is None else f", dev PPL {event.dev_ppl:.2f}"
        print(f"step {event.step:,}: checkpoint saved{ppl}", flush=True)


def translate_dev(recipe: RecipeConfig, threads: int) -> Path:
    """The dev set translated by the run's last checkpoint with the recipe's beam search
    (beam, alpha, maximum length; the other settings `nmt translate`'s defaults), into
    DEV_HYP in the run directory."""
    from nmt_cli import Translator
    from nmt_cli.config import DecodeConfig
    from nmt_cli.core.files import atomic_write_text
    from nmt_cli.data_dir import open_data_dir
    from nmt_cli.text_io import read_lines

    run_dir = Path(recipe.train.run_dir)
    d = recipe.decode
    cfg = DecodeConfig(
        beam_size=d.beam_size,
        length_penalty=d.length_penalty,
        max_len_a=d.max_len_a,
        max_len_b=d.max_len_b,
        threads=threads,
    )
    source = open_data_dir(recipe.data.dir).raw_text("valid", "src")
    if not source.is_file():
        raise NmtError(f"{source}: no raw dev text to translate; rerun nmt prepare")
    lines = read_lines(source)
    with Translator.load(run_dir / "checkpoints" / "last.pt", cfg, on_fallback=_fallback) as tr:
        hyps = [t.text for t in tr.translate(lines)]
    out = run_dir / DEV_HYP
    atomic_write_text(out, "".join(h + "\n" for h in hyps))
    return out


def _fallback(reason: str) -> None:
    print(f"notice: decoding with the Python step, the compiled one is unavailable: {reason}")
