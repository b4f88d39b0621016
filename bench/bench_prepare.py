"""Benchmark `nmt prepare`: pairs per second for each stage, and peak memory.

Generates a synthetic parallel corpus of N pairs (gzipped text, a Zipf-distributed
vocabulary of 30,000 pseudo-words a side, 3-40 words a sentence, the shape of a news
corpus), prepares it with an 8,000-piece joint BPE, and prints each stage's rate and the
peak resident memory of the preparing process and of its largest worker. Running two sizes
shows whether memory grows with the corpus (it should not). Optionally also prepares a real
corpus directory such as Multi30k.

    .venv/bin/python bench/bench_prepare.py --pairs 100000 1000000 \
        --multi30k DIR    # DIR: a local copy of Multi30k
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SYLLABLES = [c + v for c in "bdfgklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ei", "au")]


def _lexicon(rng: np.random.Generator, n: int) -> np.ndarray:
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words.add("".join(rng.choice(SYLLABLES, k)))
    return np.array(sorted(words))


def generate(root: Path, pairs: int, seed: int = 0) -> None:
    """Write train/valid/test .en.gz/.de.gz files; the target is a word-by-word mapping."""
    rng = np.random.default_rng(seed)
    src_words, tgt_words = _lexicon(rng, 30_000), _lexicon(rng, 30_000)
    ranks = np.arange(1, 30_001)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", pairs), ("valid", 3000), ("test", 3000)):
        with (
            gzip.open(root / f"{split}.en.gz", "wt", encoding="utf-8", compresslevel=1) as fs,
            gzip.open(root / f"{split}.de.gz", "wt", encoding="utf-8", compresslevel=1) as ft,
        ):
            done = 0
            while done < n:
                block = min(50_000, n - done)
                lengths = rng.integers(3, 41, block)
                ids = rng.choice(30_000, size=int(lengths.sum()), p=probs)
                cuts = np.cumsum(lengths)[:-1]
                src_lines, tgt_lines = [], []
                for sent in np.split(ids, cuts):
                    src_lines.append(" ".join(src_words[sent]))
                    # a German-like target: mapped words, the last one moved to the front
                    tgt = tgt_words[np.roll(sent, 1)]
                    tgt_lines.append(" ".join(tgt).capitalize())
                fs.write("\n".join(src_lines) + "\n")
                ft.write("\n".join(tgt_lines) + "\n")
                done += block


def run_prepare(
    source: str, out: str, src: str, tgt: str, vocab: int, workers: int, sample_lines: int
) -> None:
    """Child mode: prepare, then print the stage reports and peak memory as JSON."""
    from nmt_cli.engines.prepare import PrepareConfig, prepare

    cfg = PrepareConfig(
        out=out,
        source=source,
        src=src,
        tgt=tgt,
        vocab_size=vocab,
        workers=workers,
        vocab_sample_lines=sample_lines,
        force=True,
    )
    start = time.perf_counter()
    result = prepare(cfg)
    total = time.perf_counter() - start
    report = {
        "total_s": total,
        "stages": [[r.stage, r.seconds, r.pairs] for r in result.stages],
        "train_pairs": result.manifest["splits"]["train"]["pairs"],
        "dropped": result.manifest["cleaning"]["train"]["dropped"],
        "peak_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "cpu_self_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime,
        "cpu_children_s": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime,
    }
    print(json.dumps(report))


def measure(label: str, source: Path, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        cmd = [sys.executable, __file__, "--child", str(source), str(out), "en", "de"]
        cmd += [str(args.vocab_size), str(args.workers), str(args.vocab_sample_lines)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{label}: {report['train_pairs']:,} training pairs kept, {report['total_s']:.1f} s")
    print(f"  {'stage':<10}{'seconds':>9}{'pairs/s':>12}")
    for stage, seconds, pairs in report["stages"]:
        rate = f"{pairs / seconds:,.0f}" if seconds > 0 and pairs else "-"
        print(f"  {stage:<10}{seconds:>9.1f}{rate:>12}")
    print(
        f"  peak RSS: prepare process {report['peak_self_mb']:,.0f} MB, "
        f"largest worker {report['peak_children_mb']:,.0f} MB; dropped {report['dropped']}"
    )
    print(
        f"  CPU time: prepare process {report['cpu_self_s']:.1f} s, "
        f"encoding workers {report['cpu_children_s']:.1f} s"
    )
    return report


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        source, out, src, tgt, vocab, workers, sample_lines = sys.argv[2:9]
        run_prepare(source, out, src, tgt, int(vocab), int(workers), int(sample_lines))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=0, help="0 = one per core")
    parser.add_argument("--vocab-sample-lines", type=int, default=1_000_000)
    parser.add_argument("--multi30k", type=Path, help="also prepare this en-de directory")
    parser.add_argument("--keep", type=Path, help="keep generated corpora here")
    args = parser.parse_args()
    print("command:", shlex.join(["python", *sys.argv]))
    print(f"cores: {os.cpu_count()}, workers: {args.workers or os.cpu_count()}")
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    try:
        for n in args.pairs:
            corpus = base / f"synthetic-{n}"
            if not (corpus / "test.de.gz").is_file():
                start = time.perf_counter()
                generate(corpus, n)
                print(f"\ngenerated {n:,} pairs in {time.perf_counter() - start:.1f} s")
            measure(f"synthetic {n:,} pairs", corpus, args)
        if args.multi30k:
            measure("Multi30k en-de", args.multi30k, args)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
