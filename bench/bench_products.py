"""The decoder step's linear products alone, per implementation, at decoding's row counts.

    python bench/bench_products.py [--rows 4,16,128,512] [--rounds 5]
    NMT_CPU_LEVEL=avx2 python bench/bench_products.py   # as an AVX2-only CPU runs them
    python bench/bench_products.py --d-model 256 --d-ff 1024 --vocab 8000   # Multi30k's

One thread. For each shape of a decoder step (by default the Transformer base's: d_model
512, the FFN's 2048, a 32,000-word output projection) and each row count (sentences x
beams), the best of
--rounds timings of a product through each layer the planner can build at the CPU level in
force: PyTorch's fp32 `F.linear` (MKL, capped by NMT_CPU_LEVEL), the compiled module's
fp32 layer (its AVX2 kernel up to its rows, then PyTorch's product; the planner takes it
only at the AVX2 level) and the same with oneDNN's packed product above its rows (the
planner's choice on CPUs not Intel's), its int8 kernel (the VNNI route, or the AVX-512BW
or AVX2 one below avx512_vnni, with the bits of its grids) and PyTorch's dynamic
quantized kernel (fbgemm, which reads the CPU itself and ignores the cap: on an AVX-512
machine capped at AVX2 it still runs its VNNI code). Prints microseconds a product and the
multiply-adds a second each reaches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from nmt_cli.backends.cpu.build import load_kernel
from nmt_cli.backends.cpu.linear import Fp32Linear, Fp32OnednnLinear, Int8Linear
from nmt_cli.cpu_level import cpu_level


def shapes(d_model: int, d_ff: int, vocab: int) -> dict[str, tuple[int, int]]:
    """(in, out) of a decoder step's products."""
    return {
        "attention projection": (d_model, d_model),
        "FFN in": (d_model, d_ff),
        "FFN out": (d_ff, d_model),
        "output projection": (d_model, vocab),
    }


def best_time(run: Callable[[], Tensor], rounds: int, budget_s: float = 0.2) -> float:
    """Seconds of one call, the best of `rounds` batches of calls of about budget_s/rounds."""
    run()
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(budget_s / rounds / once))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def layers(weight: Tensor, bias: Tensor) -> dict[str, Callable[[Tensor], Tensor]]:
    """The products of the planner's linear implementations at this level (fp32, int8)."""
    kernel = load_kernel()
    found: dict[str, Callable[[Tensor], Tensor]] = {
        "fp32 F.linear": lambda x: torch.nn.functional.linear(x, weight, bias)
    }
    if kernel.fp32_kernel_available():
        found["fp32 module"] = Fp32Linear.of(weight, bias, kernel)
        if torch.backends.mkldnn.is_available():
            found["fp32 module, oneDNN above"] = Fp32OnednnLinear.of(weight, bias, kernel)
    if kernel.int8_kernel_available():
        route = "VNNI" if kernel.int8_vnni_available() else "AVX2 or AVX-512BW"
        x_levels, w_levels = kernel.int8_levels()
        bits = f"{x_levels.bit_length() + 1}/{w_levels.bit_length() + 1}-bit"
        found[f"int8 module ({route}, {bits})"] = Int8Linear.of(weight, bias, kernel)
    found["int8 PyTorch (fbgemm)"] = Int8Linear.of(weight, bias)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="4,16,128,512", help="row counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"# {' '.join(sys.argv)}; CPU level {cpu_level()}; one thread")
    print("| product | rows | implementation | us a product | G multiply-adds/s |")
    print("|---|---:|---|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for name, (k, n) in shapes(args.d_model, args.d_ff, args.vocab).items():
        weight, bias = torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g)
        packed = layers(weight, bias)  # each layer takes its weight into its form once
        for m in rows:
            x = torch.randn(m, k, generator=g)
            for label, layer in packed.items():
                seconds = best_time(lambda layer=layer, x=x: layer(x), args.rounds)
                rate = m * k * n / seconds / 1e9
                print(f"| {name} {k}x{n} | {m} | {label} | {seconds * 1e6:.1f} | {rate:.1f} |")


if __name__ == "__main__":
    main()
