"""The harness side of the decoding benchmarks: every system in a process of its own,
pinned to the same cores.

A `Layout` is the cores a run may use and how each system spends them: `n` batches side
by side, one thread each (nmt: `threads=n, workers=n`; CTranslate2: inter_threads=n,
intra_threads=1). Every process of the run is started under `taskset -c CORES` (or, where
there is no taskset, with its affinity set before it starts), so the systems get the same
cores; they run one after another, never at the same time.

`run_worker` starts a worker script (peer_worker.py) and returns what it measured;
`time_command` times a whole command (`nmt translate`) from outside: its wall time on the
input minus its start-up, measured as the median wall time of the same command on an
empty input (Python, imports, model load; it reads nothing and decodes nothing).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Layout:
    """The first `n` usable cores, `n` batches side by side with one thread each."""

    cores: tuple[int, ...]

    @classmethod
    def first(cls, n: int) -> Layout:
        cores = usable_cores()
        if not 1 <= n <= len(cores):
            raise SystemExit(f"a layout of {n} cores: this process may use {len(cores)}")
        return cls(tuple(cores[:n]))

    @property
    def n(self) -> int:
        return len(self.cores)

    @property
    def name(self) -> str:
        return "1 core" if self.n == 1 else f"{self.n} cores"

    @property
    def cpu_list(self) -> str:
        return ",".join(map(str, self.cores))

    def describe(self) -> str:
        n = self.n
        return (
            f"{self.name} (cores {self.cpu_list}): every process pinned to them; {n} batch(es) "
            f"side by side, 1 thread each: nmt threads={n}, workers={n} "
            f"(`nmt translate --threads {n} --workers {n}`), CTranslate2 inter_threads={n}, "
            f"intra_threads=1"
        )

    def pinned(self, command: list[str]) -> tuple[list[str], Callable[[], None] | None]:
        """`command` under `taskset -c CORES`, or unchanged with a function that sets the
        affinity in the child before it runs (no taskset on this system)."""
        if shutil.which("taskset"):
            return ["taskset", "-c", self.cpu_list, *command], None
        return command, lambda: os.sched_setaffinity(0, self.cores)


def worker_command(script: str, model: Path, lines: Path, output: Path, **flags: Any) -> list[str]:
    """`python bench/SCRIPT MODEL LINES OUTPUT --flag value ...` (True: a bare flag)."""
    command = [sys.executable, str(BENCH / script), str(model), str(lines), str(output)]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False and value is not None:
            command += [flag, str(value)]
    return command


def _run(command: list[str], layout: Layout) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `command` pinned to `layout`; (the finished process, the command as run)."""
    pinned, preexec = layout.pinned(command)
    done = subprocess.run(pinned, capture_output=True, text=True, preexec_fn=preexec)
    shown = shlex.join(pinned) + ("" if preexec is None else f"  # affinity {layout.cpu_list}")
    if done.returncode:
        raise SystemExit(f"{shown}\nfailed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done, shown


@dataclass(frozen=True)
class WorkerRun:
    command: str  # as run, taskset included
    report: dict[str, Any]  # the worker's JSON line (peer_worker.time_and_report)
    outputs: list[str]

    def describe(self) -> str:
        """How the system decoded: its settings, the cores it ran on, whether torch was
        imported in its process, its load time."""
        report = self.report
        settings = ", ".join(f"{k} {v}" for k, v in report["settings"].items())
        return (
            f"{settings}; affinity {report['affinity']}; torch imported: "
            f"{'yes' if report['torch_loaded'] else 'no'}; load {report['load_seconds']:.1f}s"
        )


def run_worker(command: list[str], output: Path, layout: Layout) -> WorkerRun:
    """Run one worker pinned to `layout`; its report and translations."""
    done, shown = _run(command, layout)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return WorkerRun(shown, report, output.read_text(encoding="utf-8").splitlines())


@dataclass(frozen=True)
class CommandRun:
    command: str  # as run on the input, taskset included
    wall: float  # seconds, the whole command on the input
    startup: list[float]  # seconds, the same command on an empty input, each run
    outputs: list[str]
    stderr: str  # what the command said on the input

    @property
    def seconds(self) -> float:
        """The command's time on the input beyond its start-up."""
        return self.wall - statistics.median(self.startup)


def time_command(
    command: list[str], input: Path, output: Path, layout: Layout, startup_runs: int
) -> CommandRun:
    """`command -i INPUT -o OUTPUT` timed whole, pinned to `layout`, less the median of
    `startup_runs` runs of `command -i EMPTY -o OUTPUT`, half of them before and half
    after (a host whose speed drifts moves both alike)."""
    empty = output.with_name(output.name + ".empty-input")
    empty.write_text("", encoding="utf-8")

    def startup(runs: int) -> list[float]:
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            _run([*command, "-i", str(empty), "-o", str(output)], layout)
            seconds.append(time.perf_counter() - start)
        return seconds

    before = startup((startup_runs + 1) // 2)
    start = time.perf_counter()
    done, shown = _run([*command, "-i", str(input), "-o", str(output)], layout)
    wall = time.perf_counter() - start
    outputs = output.read_text(encoding="utf-8").splitlines()
    after = startup(startup_runs // 2)
    return CommandRun(shown, wall, before + after, outputs, done.stderr)
