"""Training's attention on a CPU, alone: the core's written-out reference against the
compiled kernel (csrc/attention_train.cpp), forward and forward + backward.

The shapes are one decoder layer's of the Multi30k recipe's update: 240 sentences of 17
target and 15 source tokens (about 4,000 padded tokens a side), 4 heads of 64, bf16
heads cut from one projection's output as the model cuts them; the causal
self-attention and the padding-masked cross-attention, then the sum of both contexts
with its heads merged (what the output projections read). Both variants run in turn in
one process and each is reported by its median, because this host's speed drifts.

    .venv/bin/python bench/bench_train_attention.py --threads 2 --rounds 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from nmt_cli.backends.cpu.training import compiled_attention, training_kernel
from nmt_cli.core.attention import Attention
from nmt_cli.core.attention import attention as written_out_attention


def layer(
    sentences: int, length: int, keys: int, heads: int, d: int
) -> Callable[[Attention, bool], None]:
    """One decoder layer's two attentions over fixed random inputs."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(sentences, length, 3 * heads * d, generator=gen).bfloat16()
    memory = torch.randn(sentences, keys, 2 * heads * d, generator=gen).bfloat16()
    qkv.requires_grad_()
    memory.requires_grad_()
    lengths = torch.randint(keys // 2, keys + 1, (sentences,), generator=gen)
    mask = (torch.arange(keys) < lengths[:, None])[:, None, None, :]

    def split(t: Tensor) -> list[Tensor]:
        """A projection's output cut into its parts' heads, views as the model cuts them."""
        n = t.size(1)
        return [p.view(sentences, n, heads, d).transpose(1, 2) for p in t.split(heads * d, -1)]

    def run(attend: Attention, backward: bool) -> None:
        q, k, v = split(qkv)
        mk, mv = split(memory)
        out = attend(q, k, v, None, True) + attend(q, mk, mv, mask, False)
        merged = out.transpose(1, 2).reshape(sentences, length, heads * d)
        if backward:
            merged.float().sum().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel, why_not = training_kernel()
    if kernel is None:
        raise SystemExit(f"the compiled kernels cannot be had here: {why_not}")
    print("command: python " + " ".join(sys.argv))
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    run = layer(sentences=240, length=17, keys=15, heads=4, d=64)
    variants = {"reference": written_out_attention, "compiled": compiled_attention(kernel)}
    for backward in (False, True):
        times: dict[str, list[float]] = {name: [] for name in variants}
        for attend in variants.values():
            run(attend, backward)  # warm-up
        for _ in range(args.rounds):
            for name, attend in variants.items():
                start = time.perf_counter()
                run(attend, backward)
                times[name].append(time.perf_counter() - start)
        what = "forward + backward" if backward else "forward"
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        print(
            f"  {what}: reference {medians['reference']:.2f} ms, compiled "
            f"{medians['compiled']:.2f} ms ({medians['reference'] / medians['compiled']:.2f}x)"
        )


if __name__ == "__main__":
    main()
