"""Training throughput of base and big on one GPU, bf16: target tokens/s and % of peak.

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
variant is credited the same work; the rate is compared with the dense bf16 peak given on
the command line (H200: ~990 TFLOP/s) and with the matmul rate measured in the same run.

    python bench/gpu_train.py --models base,big --variants nmt,eager,baseline \\
        --steps 60 --max-tokens 25000
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

from nmt_cli.core.attention_kernels import AttentionBackend
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


def wmt_like_corpus(cfg: ModelConfig, max_tokens: int, count: int) -> Corpus:
    rng = np.random.default_rng(0)
    n = 200_000
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
    peaks: tuple[float, float],
    device: torch.device,
) -> str:
    """One model in one variant: the first update, 9 more, then `steps` timed updates
    over the corpus's batches; returns (and prints) one line of figures."""
    variant = VARIANTS[key]
    torch.manual_seed(0)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    model = Transformer(cfg).to(device)
    model.set_attention_backend(variant.attention)
    objective = TrainingObjective(
        model, 0.1, PAD_ID, variant.fused_projection, "inductor" if variant.compiled else None
    )
    updater = Updater(objective, paper_adam(model.parameters()), "bf16", device, 0.0, 1)
    batches: list[Batch] = [
        collate(corpus.src, corpus.tgt, g, variant.multiple).to(device) for g in corpus.groups
    ]
    t = time.perf_counter()
    updater.update([(batches[0], 1.0)], batches[0].tgt_tokens, 1e-4, [0])
    first = time.perf_counter() - t
    for i in range(1, min(10, len(batches))):
        updater.update([(batches[i], 1.0)], batches[i].tgt_tokens, 1e-4, [i])
    if gpu:
        torch.cuda.synchronize(device)
    tokens, flops = 0, 0.0
    t = time.perf_counter()
    for i in range(steps):
        k = i % len(batches)
        updater.update([(batches[k], 1.0)], batches[k].tgt_tokens, 1e-4, [i])
        tokens += corpus.tokens[k]
        flops += corpus.flops[k]
    if gpu:
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t
    peak_tflops, measured = peaks
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if gpu else float("nan")
    line = (
        f"{name} {key}: {steps} steps of ~{tokens / steps:,.0f} target "
        f"tokens, {dt / steps * 1000:.0f} ms/step, {tokens / dt:,.0f} tgt tok/s, "
        f"{flops / dt / 1e12:,.0f} TFLOP/s = {flops / dt / (peak_tflops * 1e12):.1%} of the "
        f"{peak_tflops:,.0f} TFLOP/s peak, {flops / dt / measured:.1%} of the measured "
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
    parser.add_argument("--peak-tflops", type=float, default=990.0, help="dense bf16 peak")
    parser.add_argument("--no-probe", action="store_true", help="skip the kernel probe")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: this benchmark is for a GPU machine; skipped")
        return
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    print("command:", shlex.join(["python", *sys.argv]))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}")
    measured = matmul_peak(device)
    print(f"bf16 matmul (8192^3) measured: {measured / 1e12:,.0f} TFLOP/s", flush=True)
    if not args.no_probe:
        probe_kernels(device)
    failed = False
    for name in args.models.split(","):
        cfg = MODELS[name]
        corpus = wmt_like_corpus(cfg, args.max_tokens, args.batches)
        for key in args.variants.split(","):
            try:
                peaks = (args.peak_tflops, measured)
                run_variant(name, key, cfg, corpus, args.steps, peaks, device)
            except Exception:  # one variant's failure must not cost the others' figures
                failed = True
                print(f"{name} {key}: FAILED")
                traceback.print_exc(limit=6)
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
