"""Latency of one line at a time: `nmt translate` used as a server, next to in-process decoding.

    python bench/bench_interactive.py DIR/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/average.pt --lines 100

(DIR: a local copy of Multi30k.) Starts `python -m nmt_cli translate -m MODEL -q` with
stdin a pipe, writes one line, waits until its translation comes back on stdout, and only
then writes the next: the latency a program talking to the command sees. Beside it, in
the same run: nmt's Translator in this process on one line at a time (batch 1, the
command's default thread layout and precision), and CTranslate2 (exported with
`nmt export`, see peer_ct2.py) on one line at a time with one thread, in a process of
its own pinned to one core (it never shares a process with PyTorch's threads). Prints
median and 90th-percentile latency and lines/s. The first line of each system is a
warm-up (loading, kernels) and is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peer_ct2 import export, one_line_at_a_time
from peer_launch import Layout

from nmt_cli.text_io import read_lines


@dataclass(frozen=True)
class Latency:
    system: str
    seconds: list[float]  # one a line, in input order

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)

    @property
    def p90_ms(self) -> float:
        return 1000 * statistics.quantiles(self.seconds, n=10, method="inclusive")[-1]

    @property
    def lines_per_s(self) -> float:
        return len(self.seconds) / sum(self.seconds)

    def describe(self) -> str:
        return (
            f"{self.system}: median {self.median_ms:.1f} ms, p90 {self.p90_ms:.1f} ms, "
            f"{self.lines_per_s:.1f} lines/s ({len(self.seconds)} lines)"
        )


def one_at_a_time(name: str, answer: Callable[[str], object], lines: list[str]) -> Latency:
    answer(lines[0])  # warm-up
    seconds = []
    for line in lines:
        start = time.perf_counter()
        answer(line)
        seconds.append(time.perf_counter() - start)
    return Latency(name, seconds)


def server_latency(model: Path, lines: list[str], precision: str) -> Latency:
    """`nmt translate` in a subprocess, fed and read one line at a time through pipes,
    pinned to the core CTranslate2 runs on, with one thread as CTranslate2 has."""
    command = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(model), "-q"]
    command += ["--precision", precision, "--threads", "1"]
    command, set_affinity = Layout.first(1).pinned(command)
    print("server:", " ".join(command), flush=True)
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            preexec_fn=set_affinity,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def answer(line: str) -> bytes:
            stdin.write(line.encode("utf-8") + b"\n")
            stdin.flush()
            out = stdout.readline()
            if not out:
                errors.seek(0)
                raise SystemExit(f"nmt translate ended early: {errors.read().decode()}")
            return out

        try:
            name = f"nmt translate process ({precision}, 1 thread), stdin/stdout"
            latency = one_at_a_time(name, answer, lines)
        finally:
            stdin.close()
            proc.wait(timeout=60)
    return latency


def in_process_latency(model: Path, lines: list[str], precision: str) -> Latency:
    from nmt_cli import Translator

    translator = Translator.load(model, batch_sentences=1, precision=precision, threads=1)
    name = (
        f"nmt Translator in process, batch 1 ({translator.precision}, {translator.threads} threads)"
    )
    return one_at_a_time(name, translator.translate, lines)


def report(
    model: Path, lines: list[str], ct2_dirs: dict[str, Path], precisions: list[str]
) -> list[Latency]:
    """Every system's latency on `lines`, printed as measured."""
    print(f"\none line at a time, {len(lines)} lines, beam 4:", flush=True)
    results = []
    for precision in precisions:
        for measure in (server_latency, in_process_latency):
            results.append(measure(model, lines, precision))
            print(" ", results[-1].describe(), flush=True)
    for compute_type, model_dir in ct2_dirs.items():
        # CTranslate2 in a process of its own on one core, never beside PyTorch's threads.
        seconds, command = one_line_at_a_time(model_dir, compute_type, lines)
        name = f"CTranslate2 {compute_type}, its own process on 1 core, batch 1"
        results.append(Latency(name, seconds))
        print(" ", results[-1].describe(), flush=True)
        print(f"    {command}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path, help="source lines (gz)")
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--lines", type=int, default=100, help="lines sent one at a time")
    parser.add_argument("--ct2", default="float32,int8", help="CTranslate2 exports to compare")
    parser.add_argument("--precisions", default="auto,int8", help="nmt's precisions to time")
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]), flush=True)
    lines = read_lines(args.test_src)[: args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {c: Path(tmp) / f"ct2-{c}" for c in args.ct2.split(",") if c}
        for compute_type, model_dir in dirs.items():
            print("export:", export(args.model, model_dir, compute_type), flush=True)
        report(args.model, lines, dirs, args.precisions.split(","))


if __name__ == "__main__":
    main()
