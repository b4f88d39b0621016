"""Restricted self-attention's cost (the paper's Table 1): time and peak memory of one
encoder layer's self-attention, forward and backward, full against windows of r positions.

The module is the model's own (`MultiHeadAttention` of core/transformer.py, in training
mode, dropout off, as the encoder calls it with its source key mask), batch 1, d_model 512,
8 heads, fp32. Full attention computes n x n scores per head (on a CPU the written-out form,
as `nmt train` runs it); a window r computes them in blocks (core/local_attention.py), so
its cost should grow as n, full attention's as n^2. Each measurement runs in a fresh
process: its time is the best of `--reps` passes after one warm-up, its memory the peak
resident set above what the process held before the first pass (on a GPU, the peak
allocated by PyTorch). Full attention stops at `--full-cap-gib`: at n = 16,384 one fp32
score matrix is 1 GiB per head, and a pass holds several per head at once.

    .venv/bin/python bench/bench_local_attention.py                    # n = 512 .. 16,384
    .venv/bin/python bench/bench_local_attention.py --lengths 256 512 1024 --reps 1
    .venv/bin/python bench/bench_local_attention.py --no-full --lengths 1024 16384

The default run takes about 4 minutes on 2 CPU cores, most of it full attention at
n = 8,192 (about 7 GiB at its peak; 16,384 is capped); run it on an otherwise idle
machine, as other processes' use of the caches and memory bandwidth shows in the ratios.
Above 32 MiB glibc's malloc maps every tensor afresh, so with its default settings the
largest lengths also pay for page faults that the smaller ones do not; `--heap kept`
runs the passes as `nmt train` runs its updates on a CPU, with freed memory kept for the
next one (nmt_cli/heap.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

LENGTHS = [512, 1024, 2048, 4096, 8192, 16384]
WINDOWS = [64, 256]
D_MODEL, HEADS = 512, 8
# Bytes a full pass holds per score element at its peak (scores, masked scores, weights,
# their gradient), measured on a CPU at n = 2,048: the cap's estimate.
FULL_BYTES_PER_SCORE = 16
# length -> window (0: full) -> {"seconds", "peak_mib"}
Table = dict[int, dict[int, dict[str, float]]]


def measure(
    length: int, window: int, reps: int, device: str, threads: int, heap: str = "default"
) -> dict[str, float]:
    """One configuration, in this process: best seconds of forward + backward, and the peak
    memory (MiB) the passes added. On a CPU, `heap` "kept" runs the passes as `nmt train`
    runs its updates, with freed memory kept for the next pass (nmt_cli/heap.py);
    "default" with glibc's defaults, which map every block over 32 MiB afresh and fault
    its pages in on every pass."""
    import contextlib

    import torch

    from nmt_cli.core.model_config import ModelConfig
    from nmt_cli.core.transformer import MultiHeadAttention
    from nmt_cli.heap import reused_heap

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D_MODEL, n_heads=HEADS, dropout=0.0, attention_window=window)
    attention = MultiHeadAttention(cfg, self_attention=True).to(device).train()
    x = torch.randn(1, length, D_MODEL, device=device, requires_grad=True)
    key_mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = float(torch.cuda.memory_allocated())
    else:
        before = _resident_mib()
    best = float("inf")
    kept = heap == "kept" and not cuda
    with reused_heap() if kept else contextlib.nullcontext():
        for rep in range(reps + 1):
            start = time.perf_counter()
            attention(x, key_mask=key_mask).values.sum().backward()
            if cuda:
                torch.cuda.synchronize()
            if rep:  # the first pass warms up allocator and kernels
                best = min(best, time.perf_counter() - start)
            x.grad = None
            attention.zero_grad(set_to_none=True)
    if cuda:
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {"seconds": best, "peak_mib": peak}


def _resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def in_fresh_process(length: int, window: int, args: argparse.Namespace) -> dict[str, float]:
    """`measure` in a child process, so each peak is its own."""
    command = [sys.executable, __file__, "--one", str(length), str(window)]
    command += ["--reps", str(args.reps), "--device", args.device, "--threads", str(args.threads)]
    command += ["--heap", args.heap]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr.strip()}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--windows", type=int, nargs="+", default=WINDOWS)
    parser.add_argument("--reps", type=int, default=3, help="timed passes after a warm-up")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch)")
    parser.add_argument(
        "--full-cap-gib",
        type=float,
        default=8.0,
        help="skip full attention where its estimated peak exceeds this",
    )
    parser.add_argument(
        "--no-full", action="store_true", help="measure the windows only (full is slow at large n)"
    )
    parser.add_argument(
        "--heap",
        choices=["default", "kept"],
        default="default",
        help="CPU: glibc's defaults, or freed memory kept between passes as nmt train keeps it",
    )
    parser.add_argument("--one", type=int, nargs=2, metavar=("N", "R"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        length, window = args.one
        result = measure(length, window, args.reps, args.device, args.threads, args.heap)
        print(json.dumps(result))
        return
    print("command:", shlex.join(["python", *sys.argv]))
    print(f"one encoder self-attention layer, batch 1, d_model {D_MODEL}, {HEADS} heads, fp32, ")
    print(f"forward + backward on {args.device}, best of {args.reps}; memory: peak added, MiB")
    print(f"heap: {args.heap} (kept: freed memory kept between passes, as nmt train does)")
    columns = [*([] if args.no_full else [0]), *args.windows]
    names = ["full" if r == 0 else f"r={r}" for r in columns]
    print(f"{'n':>7} " + " ".join(f"{name + ' s':>10} {name + ' MiB':>10}" for name in names))
    table: Table = {}
    for n in args.lengths:
        row = table.setdefault(n, {})
        cells = []
        for r in columns:
            estimate = FULL_BYTES_PER_SCORE * HEADS * n * n / 2**30
            if r == 0 and estimate > args.full_cap_gib:
                cells.append(f"{'capped':>10} {f'~{estimate * 1024:,.0f}':>10}")
                continue
            row[r] = in_fresh_process(n, r, args)
            cells.append(f"{row[r]['seconds']:>10.3f} {row[r]['peak_mib']:>10,.0f}")
        print(f"{n:>7} " + " ".join(cells), flush=True)
    _growth(table, columns, names)


def _growth(table: Table, columns: list[int], names: list[str]) -> None:
    """Time ratios between the largest length and 1,024 (or the smallest above it)."""
    lengths = sorted(table)
    for r, name in zip(columns, names, strict=True):
        measured = [n for n in lengths if r in table[n]]
        small = next((n for n in measured if n >= 1024), None)
        if small is None or measured[-1] == small:
            continue
        large = measured[-1]
        ratio = table[large][r]["seconds"] / table[small][r]["seconds"]
        linear = large / small
        verdict = f"{ratio / linear:.2f} of linear ({linear:.0f}x), {linear**2:.0f}x quadratic"
        inside = abs(ratio / linear - 1) <= 0.2
        note = " within 20% of linear" if r and inside else ""
        print(f"{name}: time n={large:,} / n={small:,} = {ratio:.1f}x ({verdict}){note}")


if __name__ == "__main__":
    main()
