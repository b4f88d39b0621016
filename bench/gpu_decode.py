"""Decoding speed on a GPU: beam 4, sentences/s at batch 128 and at batch 1.

Translates a test set with `Translator` (what `nmt translate` runs) on the GPU in the
precision it chooses there (bf16 on Ampere and later), after a warm-up batch, and prints
sentences/s and output tokens/s, at batch 128 (the first `--sentences`, default all), then
at batch 1 (the first `--single`).

    python bench/gpu_decode.py --model runs/m30k/average.pt --input data/m30k/test.src.txt

`--device cpu --python-step --threads 1` runs the same code on a CPU (how
`GPU_CHECK_DRY=1 bash bench/gpu_check.sh` checks this script).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.translate.translator import Translator


def measure(translator: Translator, lines: list[str]) -> tuple[float, float]:
    """(sentences/s, output tokens/s) of one pass over `lines`, after a warm-up."""
    translator.translate_chunk(lines[:8])
    if translator.device.type == "cuda":
        torch.cuda.synchronize(translator.device)
    start = time.perf_counter()
    results = translator.translate_chunk(lines)
    seconds = time.perf_counter() - start
    tokens = sum(r.hypotheses[0].length for r in results if r.hypotheses)
    return len(lines) / seconds, tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--input", type=Path, required=True, help="one sentence a line")
    parser.add_argument("--single", type=int, default=200, help="sentences at batch 1")
    parser.add_argument("--sentences", type=int, default=0, help="at batch 128; 0 = all")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-len-b", type=int, default=50, help="max output = |src| + this")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = all")
    parser.add_argument(
        "--python-step", action="store_true", help="CPU: the Python step, not the C++ one"
    )
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU visible: GPU decoding speed skipped")
        return
    print("command:", shlex.join(["python", *sys.argv]))
    ckpt = load_checkpoint(args.model)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    bulk = lines[: args.sentences] if args.sentences else lines
    for batch, subset in ((128, bulk), (1, lines[: args.single])):
        cfg = DecodeConfig(
            beam_size=4,
            batch_sentences=batch,
            device=args.device,
            max_len_b=args.max_len_b,
            threads=args.threads,
            compiled_step=not args.python_step,
        )
        translator = Translator.from_checkpoint(ckpt, cfg)
        sent_s, tok_s = measure(translator, subset)
        print(
            f"beam 4, batch {batch}, {translator.device.type}: {sent_s:,.1f} sentences/s, "
            f"{tok_s:,.0f} tokens/s ({len(subset)} sentences)",
            flush=True,
        )


if __name__ == "__main__":
    main()
