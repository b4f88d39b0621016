"""Real (unpadded) tokens per update: what `train.batch_tokens` buys, on WMT-like lengths
or on a prepared data directory.

The paper's updates hold "approximately 25000 source tokens and 25000 target tokens"
(section 5.1). Prints, for 1 and 8 devices, the split `nmt train` derives and the mean
real source and target tokens of an epoch's updates, next to what the same number taken
as a padded cap (sentences x longest side, the meaning before) held.

    .venv/bin/python bench/bench_batches.py                      # synthetic WMT14-like
    .venv/bin/python bench/bench_batches.py --data data/multi30k-en-de --batch-tokens 3600
"""

from __future__ import annotations

import argparse
import shlex
import sys

import numpy as np

from nmt_cli.config import TrainConfig
from nmt_cli.core.batching import EpochPlan, plan_epoch
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.train.feed import derive_split


def wmt_like_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Long-tailed subword lengths, about 27 a sentence, the target side a little longer."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.1, 0.55, n).round(), 1, 250).astype(np.int64)
    tgt = np.clip((src * rng.normal(1.1, 0.2, n)).round(), 1, 250).astype(np.int64)
    return src, tgt


def mean_real(plan: EpochPlan) -> tuple[float, float]:
    """Mean real (source, target) tokens of the epoch's full updates."""
    counts = np.array([plan.update_real_tokens(u) for u in range(plan.updates - 1)])
    return float(counts[:, 0].mean()), float(counts[:, 1].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a prepared data directory (default: synthetic)")
    parser.add_argument("--pairs", type=int, default=1_000_000, help="synthetic pairs")
    parser.add_argument("--batch-tokens", type=int, default=25000)
    args = parser.parse_args()
    print("command:", shlex.join(["python", *sys.argv]))
    if args.data:
        src_store, tgt_store = open_data_dir(args.data).split("train")
        src, tgt = src_store.lengths, tgt_store.lengths
    else:
        src, tgt = wmt_like_lengths(args.pairs)
    print(f"{len(src):,} pairs, mean length {src.mean():.1f} source / {tgt.mean():.1f} target")
    tc = TrainConfig(batch_tokens=args.batch_tokens)
    for world in (1, 8):
        split = derive_split(tc, world, src, tgt)
        now = mean_real(plan_epoch(src, tgt, split.max_tokens, 0, 0, world, split.accum))
        before = mean_real(plan_epoch(src, tgt, -(-args.batch_tokens // world), 0, 0, world, 1))
        print(f"{world} device(s): {split.describe()}")
        print(f"  real tokens per update: {now[0]:,.0f} source / {now[1]:,.0f} target")
        print(f"  as a padded cap (before): {before[0]:,.0f} source / {before[1]:,.0f} target")


if __name__ == "__main__":
    main()
