"""Training throughput on this machine: target tokens/s and the fraction of matmul peak.

Runs the training engine's own update (`nmt_cli.engines.train.step.Updater`: forward,
label-smoothed loss, backward, Adam) on length-grouped batches shaped like Multi30k
(about 13 source / 14 target tokens a sentence), for the small Multi30k model (3+3 layers,
d_model 256, d_ff 1024, 4 heads, shared vocabulary 8,000) and for base (6+6, 512, 2048,
8 heads, vocabulary 37,000), in fp32 and bf16 autocast, with freed memory kept for the
next update as `nmt train` keeps it (`--heaps kept,default` also times glibc's own
heap) and dropout's masks and residual add, the loss's sweep, attention and the
feed-forward's bias and ReLU from nmt's compiled module as `nmt train` runs them on a CPU
(`--kernels masks+add+loss+attention+ffn,masks+loss+attention+ffn,none` also times the
update with dropout's stored masks and with core's references for all five). The matmul peak of
each precision is measured in the same run (2048^3 products), because this host's speed
drifts.

No peer figure written down earlier is divided by: this host drifts 20-40%, so a ratio
counts only within one run. With --reference it times, on the same batches, the naive
PyTorch model the performance notes profile (torch.nn.Transformer, nn.Dropout, log-softmax
cross-entropy, Adam): a ratio measured in the same run.

    .venv/bin/python bench/bench_train.py --models small --precisions fp32,bf16 --reference
    .venv/bin/python bench/bench_train.py --models small --precisions bf16 --ops
    .venv/bin/python bench/bench_train.py --models small --precisions bf16 \
        --kernels masks+loss,masks+loss+attention --alternate --steps 6 --threads 2

`--alternate` times the `--kernels` variants batch by batch in turn in one process and
pairs their times: the way to see a few percent on a host whose speed drifts more than
that between runs. `--ops` profiles the update by operation: how much of its time the
matrix products take and at what rate, which bounds what faster element-wise work could
still gain.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nmt_cli.backends.cpu.training import training_kernel
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.batching import Batch, collate, length_grouped_batches
from nmt_cli.core.flops import matmul_rate, train_flops
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.operations import REFERENCE, Operations
from nmt_cli.core.schedule import paper_adam
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import PAD_ID
from nmt_cli.engines.train.step import Updater
from nmt_cli.heap import reused_heap

MODELS = {
    "small": ModelConfig(
        encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, n_heads=4,
        src_vocab_size=8000, tgt_vocab_size=8000,
    ),
    "base": ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000),
}  # fmt: skip

PRECISIONS = (("fp32", torch.float32), ("bf16", torch.bfloat16))


ALL_KERNELS = "masks+add+loss+attention+ffn"


def multi30k_like_batches(vocab: int, max_tokens: int, count: int, seed: int = 0) -> list[Batch]:
    """Length-grouped batches of synthetic sentences with Multi30k's length profile."""
    rng = np.random.default_rng(seed)
    n = 20000
    src_len = np.clip(rng.normal(13, 4.5, n).round(), 3, 45).astype(np.int64)
    tgt_len = np.clip((src_len * rng.normal(1.08, 0.15, n)).round(), 3, 50).astype(np.int64)
    src = [rng.integers(4, vocab, int(n)) for n in src_len]
    tgt = [rng.integers(4, vocab, int(n)) for n in tgt_len]
    groups = length_grouped_batches(src_len, tgt_len, max_tokens, seed=seed, epoch=0)
    return [collate(src, tgt, idx) for idx in groups[:count]]


def batch_flops(cfg: ModelConfig, batch: Batch) -> float:
    """Matrix-product FLOPs of forward + backward on the padded batch (core/flops.py)."""
    return train_flops(cfg, batch.sentences, batch.src.size(1), batch.tgt_in.size(1))


@dataclass
class Timing:
    tokens_per_s: float
    flops_per_s: float


def time_steps(step: object, batches: list[Batch], cfg: ModelConfig, steps: int) -> Timing:
    """Median over steps of one update each, after two warm-up updates."""
    run = step  # callable(batch)
    for batch in batches[:2]:
        run(batch)  # type: ignore[operator]
    rates, flops = [], []
    for i in range(steps):
        batch = batches[i % len(batches)]
        t = time.perf_counter()
        run(batch)  # type: ignore[operator]
        dt = time.perf_counter() - t
        rates.append(batch.tgt_tokens / dt)
        flops.append(batch_flops(cfg, batch) / dt)
    return Timing(statistics.median(rates), statistics.median(flops))


def nmt_step(
    cfg: ModelConfig, precision: str, fused: bool = False, kernels: str = ALL_KERNELS
) -> Callable[[Batch], None]:
    """The engine's update on one batch; `fused`: the output projection inside the
    chunked loss (the GPU's choice); `kernels`: which of dropout's masks and residual add
    (with its mask drawn in place), the loss's sweep, attention and the feed-forward's
    bias and ReLU come from the compiled module ("masks+add+loss+attention+ffn", as `nmt
    train` on a CPU, or any of them joined by "+"), the others from the core's references
    ("none": all of them)."""
    torch.manual_seed(0)
    chosen = set(kernels.split("+")) - {"none"}
    if not chosen <= set(ALL_KERNELS.split("+")):
        raise SystemExit(
            f"--kernels: {kernels!r} names other than masks, add, loss, attention, ffn, none"
        )
    reference = compiled = REFERENCE
    if chosen:
        kernel, why_not = training_kernel()
        if kernel is None:
            raise SystemExit(f"the compiled kernels cannot be had here: {why_not}")
        compiled = machine_plan(Target(torch.device("cpu"), True, kernel=kernel)).operations
    loss_sweep = (compiled if "loss" in chosen else reference).loss_sweep
    operations = Operations(
        attention=(compiled if "attention" in chosen else reference).attention,
        biased_attention=(compiled if "attention" in chosen else reference).biased_attention,
        keep_mask=(compiled if "masks" in chosen else reference).keep_mask,
        loss_sweep=loss_sweep,
        dense_relu=(compiled if "ffn" in chosen else reference).dense_relu,
        dropout_add=(compiled if "add" in chosen else reference).dropout_add,
    )
    model = Transformer(cfg, operations)
    objective = TrainingObjective(model, 0.1, PAD_ID, fused_projection=fused, loss_sweep=loss_sweep)
    updater = Updater(
        objective, paper_adam(model.parameters()), precision, torch.device("cpu"), 0.0, 1
    )

    def run(batch: Batch) -> None:
        updater.update([(batch, 1.0)], batch.tgt_tokens, 1e-4, [0])

    return run


def alternate(steps: dict[str, Callable[[Batch], None]], batches: list[Batch], rounds: int) -> str:
    """The variants in turn on each batch (the order reversed every other round), so a
    drift of the host's speed falls on all of them alike: each variant's median rate, and
    the first variant's time over each other's, paired batch by batch."""
    names = list(steps)
    for name in names:
        for batch in batches[:2]:
            steps[name](batch)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for batch in batches:
            for name in names if r % 2 == 0 else reversed(names):
                t = time.perf_counter()
                steps[name](batch)
                seconds[name].append(time.perf_counter() - t)
                rates[name].append(batch.tgt_tokens / seconds[name][-1])
    first = names[0]
    lines = [f"    {n}: median {statistics.median(rates[n]):,.0f} tgt tok/s" for n in names]
    for name in names[1:]:
        paired = [a / b for a, b in zip(seconds[first], seconds[name], strict=True)]
        lines.append(
            f"    {name} against {first}, paired over {len(paired)} updates: median "
            f"{statistics.median(paired):.3f}x, mean {statistics.mean(paired):.3f}x"
        )
    return "\n".join(lines)


MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def product_flops(name: str, shapes: list[list[int]]) -> float:
    """FLOPs of one matrix product from its input shapes (addmm/baddbmm: bias first)."""
    a, b = shapes[1:3] if name in ("aten::addmm", "aten::baddbmm") else shapes[:2]
    return 2.0 * math.prod(a) * b[-1]


@dataclass
class OpProfile:
    """Where an update's time goes, by operation (self time, summed over updates)."""

    total_s: float
    products_s: float
    products_flops: float
    others: list[tuple[str, float]]  # the costliest other operations, seconds

    def describe(self, peak: float) -> str:
        share = self.products_s / self.total_s
        costliest = (f"{n.removeprefix('aten::')} {t / self.total_s:.1%}" for n, t in self.others)
        lines = [
            f"    by operation: matrix products {share:.1%} of the update's time, at "
            f"{self.products_flops / self.products_s / 1e9:,.0f} GFLOP/s "
            f"({self.products_flops / self.products_s / peak:.0%} of the peak); everything "
            f"else {1 - share:.1%} (if it took no time at all: {1 / share:.2f}x)",
            "    costliest other operations: " + ", ".join(costliest),
        ]
        return "\n".join(lines)


def profile_ops(step: Callable[[Batch], None], batches: list[Batch]) -> OpProfile:
    """One update of each batch under torch's profiler (after the timed ones)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for batch in batches:
            step(batch)
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    products_s = flops = 0.0
    others: dict[str, float] = {}
    for e in events:
        seconds = e.self_cpu_time_total / 1e6
        if e.key in MATRIX_PRODUCTS:
            products_s += seconds
            flops += e.count * product_flops(e.key, e.input_shapes)
        else:
            others[e.key] = others.get(e.key, 0.0) + seconds
    costliest = sorted(others.items(), key=lambda kv: -kv[1])[:8]
    return OpProfile(total, products_s, flops, costliest)


class NaiveModel(nn.Module):
    """PERF.md's naive baseline: torch.nn.Transformer with tied embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.core = nn.Transformer(
            cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
            cfg.dropout, batch_first=True,
        )  # fmt: skip
        self.drop = nn.Dropout(cfg.dropout)
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        causal = self.core.generate_square_subsequent_mask(tgt.size(1))
        out = self.core(
            self.drop(self.embed(src) * self.scale),
            self.drop(self.embed(tgt) * self.scale),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
        )
        return F.linear(out, self.embed.weight)


def naive_step(cfg: ModelConfig, precision: str) -> object:
    torch.manual_seed(0)
    model = NaiveModel(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def run(batch: Batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(batch.src, batch.tgt_in)
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(),
                batch.tgt_out.reshape(-1),
                ignore_index=PAD_ID,
                label_smoothing=0.1,
                reduction="sum",
            )
        (loss / batch.tgt_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="small,base")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    parser.add_argument("--reference", action="store_true", help="also time the naive model")
    parser.add_argument(
        "--ops",
        action="store_true",
        help="also profile the update by operation: the matrix products' share of its "
        "time and their rate, and what else it spends time on",
    )
    parser.add_argument(
        "--kernels",
        default=ALL_KERNELS,
        help="comma list of what comes from nmt's compiled module, each 'none' (core's "
        "references, PyTorch's operations) or some of masks, loss and attention joined by "
        f"'+' ({ALL_KERNELS!r}, as nmt train on a CPU): each is timed in turn",
    )
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="time the --kernels variants batch by batch in turn in one process (--steps "
        "rounds over the batches) and pair them, instead of one after the other",
    )
    parser.add_argument(
        "--heaps",
        default="kept",
        help="comma list of 'kept' (freed memory kept, as nmt train runs) and 'default' "
        "(glibc's own): each is timed in turn",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("command:", shlex.join([sys.executable.split("/")[-1], *sys.argv]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cpu = torch.device("cpu")
    wanted = args.precisions.split(",")  # bf16 products are slow where they are emulated
    peaks = {
        name: matmul_rate(cpu, dtype, n=2048, reps=6)
        for name, dtype in PRECISIONS
        if name in wanted
    }
    print(
        "matmul peak (2048^3): "
        + ", ".join(f"{name} {rate / 1e9:,.0f} GFLOP/s" for name, rate in peaks.items())
    )
    for name in args.models.split(","):
        cfg = MODELS[name]
        batches = multi30k_like_batches(cfg.tgt_vocab_size, args.max_tokens, count=6)
        avg = statistics.mean(b.tgt_tokens for b in batches)
        print(f"\n{name}: {len(batches)} batches of ~{avg:,.0f} target tokens")
        if args.alternate:
            for precision, heap in itertools.product(
                args.precisions.split(","), args.heaps.split(",")
            ):
                with reused_heap() if heap == "kept" else contextlib.nullcontext():
                    steps = {
                        k: nmt_step(cfg, precision, kernels=k) for k in args.kernels.split(",")
                    }
                    print(f"  {precision} ({heap} heap), compiled kernels alternated:")
                    print(alternate(steps, batches, args.steps), flush=True)
            continue
        variants = itertools.product(
            args.precisions.split(","), args.heaps.split(","), args.kernels.split(",")
        )
        for precision, heap, kernels in variants:
            with reused_heap() if heap == "kept" else contextlib.nullcontext():
                step = nmt_step(cfg, precision, kernels=kernels)
                ours = time_steps(step, batches, cfg, args.steps)
                ops = profile_ops(step, batches) if args.ops else None
            line = (
                f"  {precision} ({heap} heap, compiled {kernels}): nmt "
                f"{ours.tokens_per_s:8,.0f} tgt tok/s, "
                f"{ours.flops_per_s / 1e9:6,.0f} GFLOP/s = "
                f"{ours.flops_per_s / peaks[precision]:5.1%} of the {precision} matmul peak"
            )
            if args.reference:
                naive = time_steps(naive_step(cfg, precision), batches, cfg, args.steps)
                line += (
                    f" | naive {naive.tokens_per_s:,.0f} tok/s, nmt / naive "
                    f"{ours.tokens_per_s / naive.tokens_per_s:4.2f}x"
                )
            print(line, flush=True)
            if ops is not None:
                print(ops.describe(peaks[precision]), flush=True)


if __name__ == "__main__":
    main()
