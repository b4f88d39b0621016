"""Decoding's attention kernel alone (csrc/attention.cpp), at one decoder step's shapes.

One step of beam search over `--sentences` sentences of 4 beams each: cross-attention
(`attend_memory`, each beam reading its sentence's encoder keys and values once) over
`--source` positions, and self-attention (`attend_prefix`, which also writes the step's
new keys and values into their slots) over `--step` cached positions, with the slot
cache in bf16 (beside int8 and bf16 products) and in float32 (beside fp32 ones). One
thread; the best of --rounds timings (bench_products.best_time), microseconds a call.

    .venv/bin/python bench/bench_decode_attention.py --sentences 128 --heads 4 --d 64
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_products import best_time

from nmt_cli.backends.cpu.build import load_kernel
from nmt_cli.cpu_level import cpu_level

BEAM = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=128, help="beams: 4 a sentence")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=64, help="d_k = d_v")
    parser.add_argument("--source", type=int, default=14, help="encoder positions")
    parser.add_argument("--step", type=int, default=12, help="cached target positions")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    torch.set_num_threads(1)
    kernel = load_kernel()
    rows, h, d = args.sentences * BEAM, args.heads, args.d
    print(f"CPU level {cpu_level()}, {rows} rows, {h} heads of {d}, 1 thread")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, h * d, generator=gen)
    k_new, v_new = torch.randn(2, rows, h * d, generator=gen)
    sources = torch.arange(rows) // BEAM
    # Each row's slots: its own, up to a buffer sized for 64 steps (as search reserves).
    slots = torch.arange(rows).unsqueeze(1).repeat(1, 64).contiguous()
    scale = d**-0.5
    print("| cache | cross-attention (us) | self-attention (us) |")
    print("|---|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        memory_k, memory_v = torch.randn(2, args.sentences, args.source, h, d, generator=gen)
        cache = {
            "memory_k": memory_k.to(dtype),
            "memory_v": memory_v.to(dtype),
            "self_k": torch.zeros(rows, 64, h, d, dtype=dtype),
            "self_v": torch.zeros(rows, 64, h, d, dtype=dtype),
        }

        def cross(c: dict[str, torch.Tensor] = cache) -> torch.Tensor:
            return kernel.attend_memory(q, c["memory_k"], c["memory_v"], sources, None, scale, None)

        def prefix(c: dict[str, torch.Tensor] = cache) -> torch.Tensor:
            return kernel.attend_prefix(
                q, k_new, v_new, c["self_k"], c["self_v"], slots, args.step, scale, None
            )

        name = str(dtype).removeprefix("torch.")
        cross_us = best_time(cross, args.rounds) * 1e6
        prefix_us = best_time(prefix, args.rounds) * 1e6
        print(f"| {name} | {cross_us:.0f} | {prefix_us:.0f} |")


if __name__ == "__main__":
    main()
