"""Training throughput of base and big on one GPU, bf16: target tokens/s and % of peak.

Runs the training engine's own update (`Updater`: forward, label-smoothed loss, backward,
Adam) for a few hundred steps on length-grouped batches shaped like WMT14 EN-DE (about
27 tokens a sentence, shared vocabulary 37,000), and reports the matrix-product FLOP
rate against both the dense bf16 peak given on the command line (H200: ~990 TFLOP/s) and
the matmul rate measured in the same run.

    python bench/gpu_train.py --models base,big --steps 300 --max-tokens 12500
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np
import torch

# The same FLOP count as the CPU benchmark beside this file (run as a script, bench/ is on
# the import path).
from bench_train import batch_flops

from nmt_cli.core.batching import Batch, collate, length_grouped_batches
from nmt_cli.core.schedule import paper_adam
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import PAD_ID
from nmt_cli.engines.train.step import Updater

MODELS = {
    "base": ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000),
    "big": ModelConfig(
        d_model=1024, d_ff=4096, n_heads=16, dropout=0.3,
        src_vocab_size=37000, tgt_vocab_size=37000,
    ),
}  # fmt: skip


def wmt_like_batches(vocab: int, max_tokens: int, count: int, device: torch.device) -> list[Batch]:
    rng = np.random.default_rng(0)
    n = 200_000
    src_len = np.clip(rng.normal(27, 12, n).round(), 3, 120).astype(np.int64)
    tgt_len = np.clip((src_len * rng.normal(1.05, 0.15, n)).round(), 3, 130).astype(np.int64)
    src = [rng.integers(4, vocab, int(n)) for n in src_len]
    tgt = [rng.integers(4, vocab, int(n)) for n in tgt_len]
    groups = length_grouped_batches(src_len, tgt_len, max_tokens, seed=0, epoch=0)
    return [collate(src, tgt, idx).to(device) for idx in groups[:count]]


def matmul_peak(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=12500)
    parser.add_argument("--peak-tflops", type=float, default=990.0, help="dense bf16 peak")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: this benchmark is for a GPU machine")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    print("command:", shlex.join(["python", *sys.argv]))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}")
    measured = matmul_peak(device)
    print(f"bf16 matmul (8192^3) measured: {measured / 1e12:,.0f} TFLOP/s")
    for name in args.models.split(","):
        cfg = MODELS[name]
        torch.manual_seed(0)
        model = Transformer(cfg).to(device)
        updater = Updater(
            model, paper_adam(model.parameters()), "bf16", device, 0.1, PAD_ID, 0.0, 1
        )
        batches = wmt_like_batches(cfg.tgt_vocab_size, args.max_tokens, 64, device)
        for batch in batches[:10]:
            updater.update([(batch, 1.0)], batch.tgt_tokens, 1e-4, [0])
        torch.cuda.synchronize()
        tokens = 0
        flops = 0.0
        t = time.perf_counter()
        for i in range(args.steps):
            batch = batches[i % len(batches)]
            updater.update([(batch, 1.0)], batch.tgt_tokens, 1e-4, [i])
            tokens += batch.tgt_tokens
            flops += batch_flops(cfg, batch)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        print(
            f"{name}: {args.steps} steps of ~{tokens / args.steps:,.0f} target tokens, "
            f"{dt / args.steps * 1000:.0f} ms/step, {tokens / dt:,.0f} tgt tok/s, "
            f"{flops / dt / 1e12:,.0f} TFLOP/s = {flops / dt / (args.peak_tflops * 1e12):.1%} "
            f"of the {args.peak_tflops:,.0f} TFLOP/s peak, "
            f"{flops / dt / measured:.1%} of the measured matmul rate",
            flush=True,
        )
        del model, updater, batches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
