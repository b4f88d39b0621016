"""Peak memory of `nmt translate` and the worker processes it starts (bench_translate.py).

Samples every 0.1 s, from /proc, the resident and proportional sets of a fresh command and
its descendants (proportional counts a page shared by n processes as 1/n, so the workers'
shared model is counted once). Linux only.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Memory:
    """Peak memory (MiB) of a command and the worker processes it starts."""

    largest: float  # the largest single process's peak resident set
    rss: float  # the highest sum of the processes' resident sets, sampled
    pss: float  # the same for proportional sets: pages shared by n processes count 1/n each
    seconds: float


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def _rollup(pid: int) -> tuple[float, float]:
    """(Rss, Pss) of one process in MiB, (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0, 0.0
    fields = {line.split(":")[0]: float(line.split()[1]) for line in text.splitlines()[1:]}
    return fields.get("Rss", 0.0) / 1024, fields.get("Pss", 0.0) / 1024


def peak_memory(command: list[str]) -> Memory:
    """Peak memory and wall time of a fresh subprocess and its workers, sampled every
    0.1 s from /proc (a peak shorter than that can be missed)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    largest = rss = pss = 0.0
    while proc.poll() is None:
        sizes = [_rollup(p) for p in _tree(proc.pid)]
        largest = max([largest, *(r for r, _ in sizes)])
        rss, pss = max(rss, sum(r for r, _ in sizes)), max(pss, sum(p for _, p in sizes))
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    if proc.returncode:
        assert proc.stderr is not None
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.read().decode().strip()}")
    return Memory(largest, rss, pss, seconds)


def report(model: Path, lines: list[str], uncapped_reps: int, memory_lines: int) -> None:
    """Peak memory of fresh `nmt translate` processes (default settings) on `lines`, on
    `uncapped_reps` copies of them, and on `memory_lines` lines with capped outputs."""
    base = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(model), "-q"]
    print(f"\npeak resident memory of `nmt translate` (defaults), fresh processes: {base[2:]}")
    # A build of the compiled module (after a source change) would be measured with it.
    subprocess.run(base, input="warm-up\n", capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            (1, [], "full length"),
            (uncapped_reps, [], "full length"),
            (-(-memory_lines // len(lines)), ["--max-len-a", "0", "--max-len-b", "2"],
             "outputs capped at 2 tokens, so it takes minutes, not an hour"),
        ]  # fmt: skip
        for reps, extra, note in runs:
            if reps < 1:
                continue
            path = Path(tmp) / f"input-{reps}.txt"
            with open(path, "w", encoding="utf-8") as fh:
                for _ in range(reps):
                    fh.write("\n".join(lines) + "\n")
            command = [*base, "-i", str(path), *extra]
            mem = peak_memory(command)
            print(
                f"  {reps * len(lines):,} lines ({note}): largest process {mem.largest:.0f} MiB, "
                f"all processes {mem.rss:.0f} MiB resident / {mem.pss:.0f} MiB proportional, "
                f"in {mem.seconds:.0f}s; extra flags: {' '.join(extra) or 'none'}",
                flush=True,
            )
