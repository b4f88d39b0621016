"""Real `nmt train` on the CPU in each layout of its cores, side by side in one run.

Each layout trains the same recipe from scratch for the same number of updates, as the
command a user runs (`nmt train`, its own process), on a quiet machine:

    1 thread          one process, train.threads = 1, pinned to one core (taskset)
    N threads         one process, train.threads = N (all cores)
    N processes       --procs N: DDP over gloo, one thread each
    auto              what `nmt train` picks by itself (its start-up line says which)

The rate of each is its target tokens per second of update wall time from metrics.jsonl,
after the first log interval (start-up, process spawn and first-shape warm-up excluded);
validation and checkpoints are left out (one save at the end). Ratios are against the
1-thread layout measured in the same run.

    .venv/bin/python bench/bench_layouts.py --data data/multi30k-en-de --updates 60
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nmt_cli.cpus import usable_cpus


def run_layout(
    name: str, args: argparse.Namespace, run_dir: Path, extra: list[str], pin: str | None
) -> dict[str, float | str]:
    """Train one layout; its rate from the metrics records after the first."""
    nmt = str(Path(sys.executable).with_name("nmt"))
    command = [
        nmt, "train", args.recipe, "--run-dir", str(run_dir), "--quiet",
        "--set", f'data.dir="{args.data}"',
        "--set", f"train.max_steps={args.updates}",
        "--set", "train.max_time_minutes=0",
        "--set", "train.save_interval_minutes=0",
        "--set", f"train.log_interval_steps={args.log_every}",
        "--set", f'train.precision="{args.precision}"',
        "--set", "train.tensorboard=false",
        *extra,
    ]  # fmt: skip
    if pin is not None:
        command = ["taskset", "-c", pin, *command]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: nmt train failed:\n{done.stderr[-2000:]}")
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"train"' in line
    ]
    first, last = records[0], records[-1]
    updates = last["step"] - first["step"]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    rates = [r["tokens_per_s"] for r in records[1:]]
    log = (run_dir / "train.log").read_text()
    start_line = next((x for x in log.splitlines() if "starting" in x), "")
    return {
        "layout": name,
        "updates_per_s": updates / seconds,
        "tokens_per_s": sum(rates) / len(rates),
        "wall_s": wall,
        "start": start_line.split(": ", 1)[-1][:160],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/multi30k-en-de.toml")
    parser.add_argument("--data", required=True, help="prepared data directory (nmt prepare)")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--layouts", default="1-thread,threads,processes,auto")
    args = parser.parse_args()
    print("command:", shlex.join([sys.executable.split("/")[-1], *sys.argv]))
    cores = usable_cpus()
    first_core = str(min(os.sched_getaffinity(0)))
    layouts = {
        "1-thread": ("1 thread", ["--set", "train.threads=1"], first_core),
        "threads": (f"{cores} threads", ["--set", f"train.threads={cores}"], None),
        "processes": (
            f"{cores} processes x 1 thread",
            ["--procs", str(cores), "--set", "train.threads=1"],
            None,
        ),
        "auto": ("auto", [], None),
    }
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.layouts.split(","):
            name, extra, pin = layouts[key]
            result = run_layout(name, args, Path(tmp) / key, extra, pin)
            results.append(result)
            print(
                f"  {name:26s} {result['tokens_per_s']:8,.0f} tgt tok/s  "
                f"{result['updates_per_s']:.3f} updates/s  ({result['wall_s']:.0f} s in all)",
                flush=True,
            )
    base = next((r for r in results if r["layout"] == "1 thread"), None)
    if base is not None:
        for r in results:
            ratio = float(r["tokens_per_s"]) / float(base["tokens_per_s"])
            print(f"  {r['layout']:26s} {ratio:5.2f}x one thread   [{r['start']}]")


if __name__ == "__main__":
    main()
