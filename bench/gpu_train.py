"""Training throughput of base and big on one GPU: tokens/s and % of the measured matmul rate.

Runs the training engine's own update (`TrainingObjective` + `Updater`: forward,
label-smoothed loss, backward, Adam) on length-grouped batches shaped like WMT14 EN-DE
(about 27 tokens a sentence, shared vocabulary 37,000), in up to three variants measured
in the same run, so that their ratios survive the machine's drift:

- `nmt`: what `nmt train` does on a GPU (engines/train/device_choices.py): flash and
  memory-efficient attention (no cuDNN), the output projection fused into the chunked
  loss, widths padded to multiples of 8, torch.compile with dynamic shapes. Its first
  update (compilation included) is reported on its own line;
- `eager`: the same without torch.compile;
- `baseline`: PyTorch's default attention kernels (cuDNN on recent GPUs), the unfused
  loss, unpadded widths, eager: the step as it was before those changes (the 16-bit
  LayerNorm and page-locked copies stay on).

FLOPs are counted on each batch's natural padding (its longest sentence), so every
variant is credited the same work; the rate is compared with the bf16 matmul rate
measured in the same run (a large square product), never with a spec-sheet figure.
`--precision fp16` measures the fp16 step with its gradient scaler instead of bf16.

    python bench/gpu_train.py --models base,big --variants nmt,eager,baseline \\
        --steps 60 --max-tokens 25000

`--tiny --device cpu` runs the same code on a CPU with a tiny model, a small corpus and
a small matmul (how `GPU_CHECK_DRY=1 bash bench/gpu_check.sh` checks this script).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.backends.pytorch import AttentionBackend
from nmt_cli.core.batching import Batch, collate, length_grouped_batches
from nmt_cli.core.flops import train_flops
from nmt_cli.core.objective import TrainingObjective
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
    "tiny": ModelConfig(
        encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, n_heads=2,
        src_vocab_size=60, tgt_vocab_size=60,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Variant:
    attention: AttentionBackend
    fused_projection: bool
    multiple: int
    compiled: bool


VARIANTS = {
    "nmt": Variant("auto", True, 8, True),
    "eager": Variant("auto", True, 8, False),
    "baseline": Variant("cudnn", False, 1, False),  # "cudnn" allows PyTorch's full choice
}


@dataclass(frozen=True)
class Corpus:
    src: list[np.ndarray]
    tgt: list[np.ndarray]
    groups: list[np.ndarray]
    flops: list[float]  # per batch, natural padding
    tokens: list[int]  # real target tokens per batch


def wmt_like_corpus(cfg: ModelConfig, max_tokens: int, count: int, n: int = 200_000) -> Corpus:
    """`count` length-grouped batches of `max_tokens` from `n` random sentences."""
    rng = np.random.default_rng(0)
    src_len = np.clip(rng.normal(27, 12, n).round(), 3, 120).astype(np.int64)
    tgt_len = np.clip((src_len * rng.normal(1.05, 0.15, n)).round(), 3, 130).astype(np.int64)
    src = [rng.integers(4, cfg.src_vocab_size, int(k)) for k in src_len]
    tgt = [rng.integers(4, cfg.tgt_vocab_size, int(k)) for k in tgt_len]
    groups = length_grouped_batches(src_len, tgt_len, max_tokens, seed=0, epoch=0)[:count]
    flops = [
        train_flops(cfg, len(g), int(src_len[g].max()) + 1, int(tgt_len[g].max()) + 1)
        for g in groups
    ]
    tokens = [int(tgt_len[g].sum()) + len(g) for g in groups]
    return Corpus(src, tgt, groups, flops, tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    """FLOP/s of a bf16 (n x n) @ (n x n) product, measured: the rate every training
    figure is compared with."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def probe_kernels(device: torch.device) -> None:
    """Whether flash takes the decoder's causal self-attention and the memory-efficient
    kernel the padding mask at base's head width, each alone (else 'auto' would fall
    back to the math kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(64, 8, 40, 64, device=device, dtype=torch.bfloat16)
    mask = torch.ones(64, 1, 1, 40, dtype=torch.bool, device=device)
    mask[:, :, :, 33:] = False
    checks = (
        ("flash, causal", SDPBackend.FLASH_ATTENTION, None, True),
        ("memory-efficient, padding mask", SDPBackend.EFFICIENT_ATTENTION, mask, False),
    )
    for name, backend, attn_mask, causal in checks:
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q, attn_mask=attn_mask, is_causal=causal)
            print(f"attention kernel {name}: runs")
        except RuntimeError as exc:
            print(f"attention kernel {name}: NOT available ({str(exc).splitlines()[0]})")


def run_variant(
    name: str,
    key: str,
    cfg: ModelConfig,
    corpus: Corpus,
    steps: int,
    measured: float,
    device: torch.device,
    precision: str = "bf16",
) -> str:
    """One model in one variant: the first update, up to 9 more, then `steps` timed
    updates over the corpus's batches; returns (and prints) one line of figures, the
    rate as a share of `measured` (the matmul rate, FLOP/s)."""
    variant = VARIANTS[key]
    torch.manual_seed(0)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    target = Target(device, training=True, attention_backend=variant.attention)
    model = Transformer(cfg, machine_plan(target).operations).to(device)
    objective = TrainingObjective(
        model, 0.1, PAD_ID, variant.fused_projection, "inductor" if variant.compiled else None
    )
    updater = Updater(objective, paper_adam(model.parameters()), precision, device, 0.0, 1)
    batches: list[Batch] = [
        collate(corpus.src, corpus.tgt, g, variant.multiple).to(device) for g in corpus.groups
    ]
    t = time.perf_counter()
    updater.update([(batches[0], 1.0)], batches[0].tgt_tokens, 1e-4, [0])
    first = time.perf_counter() - t
    for i in range(1, min(10, len(batches))):
        updater.update([(batches[i], 1.0)], batches[i].tgt_tokens, 1e-4, [i])
    _sync(device)
    tokens, flops = 0, 0.0
    t = time.perf_counter()
    for i in range(steps):
        k = i % len(batches)
        updater.update([(batches[k], 1.0)], batches[k].tgt_tokens, 1e-4, [i])
        tokens += corpus.tokens[k]
        flops += corpus.flops[k]
    _sync(device)
    dt = time.perf_counter() - t
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if gpu else float("nan")
    line = (
        f"{name} {key} {precision}: {steps} steps of ~{tokens / steps:,.0f} target "
        f"tokens, {dt / steps * 1000:.0f} ms/step, {tokens / dt:,.0f} tgt tok/s, "
        f"{flops / dt / 1e12:,.1f} TFLOP/s = {flops / dt / measured:.1%} of the measured "
        f"matmul rate; peak memory {memory:.1f} GiB; first update {first:.1f} s"
        + (" (compilation included)" if variant.compiled else "")
    )
    print(line, flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--variants", default="nmt,eager,baseline")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--batches", type=int, default=64, help="distinct batches cycled")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--no-probe", action="store_true", help="skip the kernel probe")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu with --tiny")
    parser.add_argument(
        "--tiny", action="store_true", help="a small corpus and matmul (for --device cpu)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible: this benchmark is for a GPU machine; skipped")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    print("command:", shlex.join(["python", *sys.argv]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}")
    size = 256 if args.tiny else 8192
    measured = matmul_rate(device, size, 3 if args.tiny else 20)
    print(f"bf16 matmul ({size}^3) measured: {measured / 1e12:,.1f} TFLOP/s", flush=True)
    if not args.no_probe and device.type == "cuda":
        probe_kernels(device)
    failed = False
    for model in args.models.split(","):
        cfg = MODELS[model]
        corpus = wmt_like_corpus(
            cfg, args.max_tokens, args.batches, 2_000 if args.tiny else 200_000
        )
        for key in args.variants.split(","):
            try:
                run_variant(model, key, cfg, corpus, args.steps, measured, device, args.precision)
            except Exception:  # one variant's failure must not cost the others' figures
                failed = True
                print(f"{model} {key} {args.precision}: FAILED")
                traceback.print_exc(limit=6)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
