"""The worker side of the decoding benchmarks: one system, one process, one timing.

The harnesses (bench_translate.py, bench_export.py) start every system they compare as a
process of its own, `python bench/peer_X.py MODEL LINES OUT --batch B --threads N ...`,
pinned with taskset to the cores of the run (peer_launch.py). Two runtimes in one process
(PyTorch's OpenMP threads next to CTranslate2's) slow each other down, and a reader who
compares toolkits runs each alone: so a worker imports only what its system needs (the
CTranslate2 worker never imports torch, and reports that it did not).

A worker loads its model (not timed), decodes the first `--warmup` lines (not timed:
kernels, allocators, worker processes), then decodes all of LINES once, timed: the
system's tokenization, decoding and detokenization, not the reading of LINES nor the
writing of OUT. It writes one translation a line to OUT and prints one JSON line, which
the harness reads. With `--one-at-a-time` it decodes the lines one by one instead and
also reports the seconds of each (the latency of a line typed at a time).

This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Output:
    text: str
    tokens: int  # target subword tokens of the best hypothesis, without </s>


Decode = Callable[[list[str]], list[Output]]  # lines -> their best translations, in order


def worker_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every worker takes; each adds its system's own (precision, ...)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", type=Path, help="the system's model (checkpoint or directory)")
    parser.add_argument("lines", type=Path, help="source sentences, one a line (UTF-8)")
    parser.add_argument("output", type=Path, help="where the translations go, one a line")
    parser.add_argument("--batch", type=int, required=True, help="sentences a batch")
    parser.add_argument(
        "--threads", type=int, required=True, help="cores: batches side by side, 1 thread each"
    )
    parser.add_argument("--warmup", type=int, default=8, help="lines decoded first, not timed")
    parser.add_argument(
        "--one-at-a-time", action="store_true", help="decode line by line: each line's seconds"
    )
    return parser


def time_and_report(
    args: argparse.Namespace,
    load: Callable[[], Decode],
    settings: Callable[[], dict[str, Any]],
) -> None:
    """Load, warm up, time, write the outputs, print the report (one JSON line).

    `settings()` (called after loading) describes how the system decodes: thread layout,
    precision, library version; the harness prints it beside the figures.
    """
    lines = args.lines.read_text(encoding="utf-8").splitlines()
    start = time.perf_counter()
    decode = load()
    load_seconds = time.perf_counter() - start
    decode(lines[: args.warmup])
    line_seconds: list[float] = []
    start = time.perf_counter()
    if args.one_at_a_time:
        outputs = []
        for line in lines:
            t0 = time.perf_counter()
            outputs += decode([line])
            line_seconds.append(time.perf_counter() - t0)
    else:
        outputs = decode(lines)
    seconds = time.perf_counter() - start
    with open(args.output, "w", encoding="utf-8") as fh:
        fh.writelines(out.text + "\n" for out in outputs)
    report = {
        "seconds": seconds,
        "load_seconds": load_seconds,
        "sentences": sum(1 for line in lines if line.strip()),
        "lines": len(lines),
        "tokens": sum(out.tokens for out in outputs),
        "warmup_lines": len(lines[: args.warmup]),
        "line_seconds": line_seconds,
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "torch_loaded": "torch" in sys.modules,
        "settings": settings(),
    }
    print(json.dumps(report))
