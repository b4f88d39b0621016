"""Decoding speed of `nmt translate` (beam 4) on Multi30k test_2016_flickr, and peak memory.

    python bench/bench_translate.py ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --model CKPT [--ref ../shared/data/multi30k/test_2016_flickr.de.gz]

Without --model, `--train-minutes M --train-dir ../shared/data/multi30k --save CKPT`
first trains the small Multi30k model (3+3 layers, d_model 256, d_ff 1024, 4 heads, joint
8k SentencePiece) for M minutes so that its outputs have realistic lengths (decoding speed
depends on them: a random model runs every sentence to the length limit).

Prints sentences/s and target tokens/s at batch 128 and batch 1, fp32 and bf16, and the
peak resident memory of `nmt translate` subprocesses on the test set and on a generated
200,000-line input, with the exact command used.
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nmt_cli.config import DecodeConfig, Precision
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint
from nmt_cli.core.losses import label_smoothed_cross_entropy
from nmt_cli.core.schedule import paper_adam, paper_learning_rate, set_learning_rate
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID, VocabPair, train_sentencepiece
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


def train_small(
    data: Path,
    minutes: float,
    save: Path,
    init: Path | None = None,
    src: str = "en",
    tgt: str = "de",
) -> Path:
    """A short, honest training run of the peer's model size (not a recipe: a stand-in
    until a trained checkpoint is given with --model). `init` continues from a checkpoint
    this function wrote (weights, vocabulary and step; Adam's moments restart)."""
    src_lines, tgt_lines = read_gz(data / f"train.{src}.gz"), read_gz(data / f"train.{tgt}.gz")
    start_ckpt = load_checkpoint(init) if init else None
    if start_ckpt is not None:
        vocab = start_ckpt.vocab
    else:
        proto = train_sentencepiece(src_lines + tgt_lines, vocab_size=8000)
        vocab = VocabPair.from_protos(proto, proto)
    cfg = ModelConfig(
        encoder_layers=3,
        decoder_layers=3,
        d_model=256,
        d_ff=1024,
        n_heads=4,
        dropout=0.1,
        src_vocab_size=len(vocab.src),
        tgt_vocab_size=len(vocab.tgt),
    )
    pairs = list(zip(vocab.src.encode(src_lines), vocab.tgt.encode(tgt_lines), strict=True))
    pairs.sort(key=lambda p: (len(p[1]), len(p[0])))
    batches: list[list[tuple[list[int], list[int]]]] = []
    current: list[tuple[list[int], list[int]]] = []
    width = 0
    for pair in pairs:
        width = max(width, len(pair[0]) + 1, len(pair[1]) + 1)
        if current and width * (len(current) + 1) > 4096:
            batches.append(current)
            current, width = [], max(len(pair[0]), len(pair[1])) + 1
        current.append(pair)
    batches.append(current)
    torch.manual_seed(1)
    model = Transformer(cfg).train()
    step = 0
    if start_ckpt is not None:
        model.load_state_dict(start_ckpt.model)
        step = start_ckpt.step
    opt = paper_adam(model.parameters())
    rng = random.Random(1 + step)
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < minutes * 60:
        rng.shuffle(batches)
        for batch in batches:
            s_w = max(len(s) for s, _ in batch) + 1
            t_w = max(len(t) for _, t in batch) + 1
            x = torch.full((len(batch), s_w), PAD_ID)
            y_in = torch.full((len(batch), t_w), PAD_ID)
            y_out = torch.full((len(batch), t_w), PAD_ID)
            for i, (s, t) in enumerate(batch):
                x[i, : len(s) + 1] = torch.tensor([*s, EOS_ID])
                y_in[i, : len(t) + 1] = torch.tensor([BOS_ID, *t])
                y_out[i, : len(t) + 1] = torch.tensor([*t, EOS_ID])
            step += 1
            set_learning_rate(opt, paper_learning_rate(step, cfg.d_model, 400))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x, y_in)
            out = label_smoothed_cross_entropy(logits.float(), y_out, 0.1, PAD_ID)
            opt.zero_grad(set_to_none=True)
            (out.loss / out.tokens).backward()
            opt.step()
            tokens += out.tokens
            if step % 50 == 0:
                rate = tokens / (time.perf_counter() - start)
                nll = float(out.nll.detach()) / out.tokens
                print(f"step {step} nll/token {nll:.3f} {rate:.0f} tok/s", flush=True)
            if time.perf_counter() - start >= minutes * 60:
                break
    minutes_total = minutes + (start_ckpt.meta.get("bench_minutes", 0) if start_ckpt else 0)
    meta = {"bench_minutes": minutes_total}
    ckpt = Checkpoint(cfg, vocab, model_state(model), step, meta=meta)
    return save_checkpoint(ckpt, save)


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
    parser.add_argument("--model", type=Path)
    parser.add_argument("--ref", type=Path, help="reference (gz) for a sanity BLEU")
    parser.add_argument("--train-minutes", type=float, default=0.0)
    parser.add_argument("--train-dir", type=Path)
    parser.add_argument("--save", type=Path, default=Path("bench_small.pt"))
    parser.add_argument("--init", type=Path, help="continue training this checkpoint")
    parser.add_argument("--single", type=int, default=300, help="sentences for batch 1")
    parser.add_argument("--memory-lines", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--skip", default="", help="comma list: fp32,bf16,single,memory")
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    threads, _ = set_threads(args.threads, 1)
    skip = set(filter(None, args.skip.split(",")))
    if args.model is None:
        if not args.train_minutes or args.train_dir is None:
            parser.error("give --model CKPT, or --train-minutes M --train-dir DIR to train one")
        args.model = train_small(args.train_dir, args.train_minutes, args.save, args.init)
        print(f"trained for {args.train_minutes} min -> {args.model}")
    ckpt = load_checkpoint(args.model)
    lines = read_gz(args.test_src)
    print(f"torch {torch.__version__}, {threads} threads, {len(lines)} test sentences, beam 4")
    layouts = [(1, 1), (threads, 1), (threads, threads)] if threads > 1 else [(1, 1)]
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
