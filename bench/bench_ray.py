"""`nmt translate --ray` next to `nmt translate` on one machine: throughput and start-up.

    python bench/bench_ray.py --model MODEL.pt [--input TEXT] [--lines 2000] \\
        [--block-lines 250] [--rounds 1]

Both commands run as a user runs them, each in a fresh process, on the same lines with the
same settings (beam 4, alpha 0.6, blocks/chunks of --block-lines lines):

- `nmt translate --workers 2 --threads 2`: two batches decoded side by side, one thread
  each, in forked worker processes;
- `nmt translate --ray --ray-address local --workers 2 --threads 1`: a new local Ray
  instance, two actors of one thread, each with its own model.

Each command runs on the first half of the lines and on all of them. Throughput is the
second half's lines over the difference of the two wall times: what the engine costs per
line once running, whatever it costs to start and stop. Start-up is the half run's wall
time less its lines at that rate: Python, imports, model loads and the end (for Ray also
starting Ray and its actors), with as many workers or actors as the real run has (a
one-line input would start one actor, not two). The outputs of the two on all the lines
are compared byte for byte. Without --input, the lines are the demo corpus's English
(engines/prepare/demo_corpus.py), for a model trained by `nmt run recipes/demo.toml`.

Prints the CPU, every exact command with its wall times, and the table; `--rounds N`
repeats every measurement N times in turn and reports medians.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nmt_cli.engines.prepare.demo_corpus import generate_pair
from nmt_cli.text_io import read_lines


def cpu_description() -> str:
    """The CPU's model name and core count, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line]
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    bf16 = "AVX-512 BF16" if "avx512_bf16" in flags else "no AVX-512 BF16"
    return f"{names[0] if names else 'unknown CPU'}, {len(names)} logical cores, {bf16}"


def system_command(name: str, model: Path, block_lines: int) -> list[str]:
    nmt = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(model), "-q"]
    common = ["--buffer-lines", str(block_lines)]
    if name == "nmt translate":
        return [*nmt, *common, "--workers", "2", "--threads", "2"]
    return [*nmt, *common, "--ray", "--ray-address", "local", "--workers", "2", "--threads", "1"]


def timed(command: list[str], source: Path, output: Path) -> float:
    """The wall time of `command` on `source`, writing `output`."""
    start = time.perf_counter()
    subprocess.run([*command, "-i", str(source), "-o", str(output)], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--input", type=Path, help="text to translate (default: demo corpus)")
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--block-lines", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    if args.input is not None:
        lines = read_lines(args.input)[: args.lines]
    else:
        lines = [generate_pair(101, i)[0] for i in range(args.lines)]
    systems = ("nmt translate", "nmt translate --ray")
    first_half = len(lines) // 2
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        folder = Path(tmp)
        full, half = folder / "full.txt", folder / "half.txt"
        full.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        half.write_text("".join(line + "\n" for line in lines[:first_half]), encoding="utf-8")
        print(f"CPU: {cpu_description()}")
        print(
            f"input: {len(lines):,} lines (and its first {first_half:,}); blocks of "
            f"{args.block_lines} lines\n"
        )
        walls: dict[str, list[float]] = {name: [] for name in systems}
        halves: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name in systems:
                command = system_command(name, args.model, args.block_lines)
                out = folder / f"{systems.index(name)}.out"
                halves[name].append(timed(command, half, folder / "half.out"))
                walls[name].append(timed(command, full, out))
                print(f"$ {shlex.join(command)} -i INPUT -o OUTPUT")
                print(f"  half: {halves[name][-1]:.2f}s, all: {walls[name][-1]:.2f}s")
        same = (folder / "0.out").read_bytes() == (folder / "1.out").read_bytes()
        print(f"\noutputs identical: {same}\n")
    print(f"{'system':<22} {'start-up s':>10} {'sent/s':>8} {'x single machine':>17}")
    rates = {}
    second_half = len(lines) - first_half
    for name in systems:
        whole, first = statistics.median(walls[name]), statistics.median(halves[name])
        rates[name] = second_half / max(whole - first, 1e-9)
        up = first - first_half / rates[name]
        ratio = rates[name] / rates[systems[0]]
        print(f"{name:<22} {up:>10.2f} {rates[name]:>8.1f} {ratio:>17.2f}")


if __name__ == "__main__":
    main()
