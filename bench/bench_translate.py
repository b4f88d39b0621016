"""Decoding speed of `nmt translate` (beam 4) on Multi30k test_2016_flickr, and peak memory.

    nmt run recipes/multi30k-en-de.toml          # the peer's model size, trained 20 minutes
    python bench/bench_translate.py ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/average.pt \\
        --ref ../shared/data/multi30k/test_2016_flickr.de.gz

The model must be trained: decoding speed depends on output lengths, and an untrained
model runs every sentence to the length limit.

Prints sentences/s and target tokens/s at batch 128 and batch 1, fp32 and bf16, and the
peak resident memory of `nmt translate` subprocesses on the test set and on a generated
200,000-line input, with the exact command used.
"""

from __future__ import annotations

import argparse
import gzip
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nmt_cli.config import DecodeConfig, Precision
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.engines.translate import Translator, set_threads

PEERS = {  # sentences/s on this machine, beam 4 (../shared/PERF.md)
    ("batch", "fairseq"): 80.0,
    ("batch", "ctranslate2"): 180.0,
    ("single", "fairseq"): 15.0,
    ("single", "ctranslate2"): 35.0,
}


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def measure(
    ckpt: Checkpoint, lines: list[str], precision: Precision, batch: int, threads: int, workers: int
) -> tuple[dict[str, float], list[str]]:
    cfg = DecodeConfig(beam_size=4, precision=precision, batch_sentences=batch)
    threads, workers = set_threads(threads, workers)
    translator = Translator.from_checkpoint(ckpt, cfg, workers)
    translator.translate(lines[:8])  # warm-up: oneDNN kernels, allocator
    start = time.perf_counter()
    results = translator.translate(lines)
    seconds = time.perf_counter() - start
    tokens = sum(r.hypotheses[0].length for r in results if r.hypotheses)
    figures = {
        "sentences": len(lines),
        "seconds": seconds,
        "sent_s": len(lines) / seconds,
        "tok_s": tokens / seconds,
        "out_tokens": tokens,
    }
    return figures, [r.text for r in results]


def peak_rss_mb(command: list[str]) -> tuple[float, float]:
    """Peak resident memory (MiB) and wall time of a fresh subprocess."""
    script = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "
        "time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    rss, secs = out.stdout.split()
    return float(rss), float(secs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--ref", type=Path, help="reference (gz) for a sanity BLEU")
    parser.add_argument("--single", type=int, default=300, help="sentences for batch 1")
    parser.add_argument("--memory-lines", type=int, default=200_000)
    parser.add_argument(
        "--uncapped-reps", type=int, default=20, help="also the test set N times, full length"
    )
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--intra-op", action="store_true", help="also time all threads on one batch"
    )
    parser.add_argument("--skip", default="", help="comma list: fp32,bf16,single,memory")
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    threads, _ = set_threads(args.threads, 1)
    skip = set(filter(None, args.skip.split(",")))
    ckpt = load_checkpoint(args.model)
    lines = read_gz(args.test_src)
    print(f"torch {torch.__version__}, {threads} threads, {len(lines)} test sentences, beam 4")
    # (threads, batches at once). Spreading one batch over all threads is opt-in: on the
    # shared 2-core machine it was anywhere from 1.7x faster to 40x slower than 1 thread.
    layouts = [(1, 1), (threads, threads)] if threads > 1 else [(1, 1)]
    if args.intra_op and threads > 1:
        layouts.insert(1, (threads, 1))
    precisions: list[Precision] = ["fp32", "bf16"]
    for precision in precisions:
        if precision in skip:
            continue
        for mode, batch, subset in (("batch", 128, lines), ("single", 1, lines[: args.single])):
            if mode in skip:
                continue
            for n_threads, workers in layouts:
                r, texts = measure(ckpt, subset, precision, batch, n_threads, workers)
                ratios = ", ".join(
                    f"{r['sent_s'] / PEERS[(mode, peer)]:.2f}x {peer}"
                    for peer in ("fairseq", "ctranslate2")
                )
                print(
                    f"{precision} batch {batch}, {n_threads} thread(s), {workers} batch(es) at "
                    f"once: {r['sent_s']:.1f} sent/s, {r['tok_s']:.0f} tok/s "
                    f"({int(r['sentences'])} sentences in {r['seconds']:.1f}s; {ratios})",
                    flush=True,
                )
                if args.ref and mode == "batch" and (n_threads, workers) == layouts[0]:
                    import sacrebleu

                    refs = read_gz(args.ref)[: len(subset)]
                    bleu = sacrebleu.corpus_bleu(texts, [refs])
                    print(f"  sacreBLEU {bleu.score:.1f} ({bleu.sys_len} / {bleu.ref_len} words)")
    if "memory" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            small, big = Path(tmp) / "small.txt", Path(tmp) / "big.txt"
            small.write_text("\n".join(lines) + "\n", encoding="utf-8")
            reps = math.ceil(args.memory_lines / len(lines))
            with open(big, "w", encoding="utf-8") as fh:
                for _ in range(reps):
                    fh.write("\n".join(lines) + "\n")
            base = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(args.model), "-q"]
            rss_small, t_small = peak_rss_mb([*base, "-i", str(small)])
            print(f"peak RSS, {len(lines)} lines, beam 4: {rss_small:.0f} MiB ({t_small:.0f}s)")
            if args.uncapped_reps:
                mid = Path(tmp) / "mid.txt"
                mid.write_text(("\n".join(lines) + "\n") * args.uncapped_reps, encoding="utf-8")
                rss_mid, t_mid = peak_rss_mb([*base, "-i", str(mid)])
                n_mid = args.uncapped_reps * len(lines)
                print(f"peak RSS, {n_mid:,} lines, beam 4: {rss_mid:.0f} MiB ({t_mid:.0f}s)")
            capped = [*base, "-i", str(big), "--max-len-a", "0", "--max-len-b", "2"]
            rss_big, t_big = peak_rss_mb(capped)
            print(
                f"peak RSS, {reps * len(lines):,} lines (outputs capped at 2 tokens so the run "
                f"takes minutes, not an hour): {rss_big:.0f} MiB ({t_big:.0f}s)"
            )
            print("command:", " ".join(capped))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this benchmark process: {own:.0f} MiB")


if __name__ == "__main__":
    main()
