"""Training speed of `nmt train` against fairseq-train: target tokens/s, one thread.

Both on the same core, the same data and the same model shape, in the same run.

The model is the small Multi30k recipe's (recipes/multi30k-en-de.toml): 3+3 layers,
d_model 256, d_ff 1024, 4 heads, dropout 0.1, post-norm, one joint SentencePiece
vocabulary of 8,000 pieces with all embeddings shared, label smoothing 0.1, Adam (0.9,
0.98), inverse-square-root warm-up. `nmt prepare` encodes the corpus; the pieces of its
training and dev sets are written out as text, with all of nmt's pieces as one dictionary
(`--srcdict`, `--joined-dictionary`), for fairseq-preprocess, so both systems train on the
same subword sequences with the same vocabulary size. Both cut batches alike: pairs
sorted by length, filled while sentences x longest side (end of sentence included) stays
within a padded budget; but nmt sorts by target length first, fairseq by source length
first, which packs a little less densely. So fairseq gets the smallest `--max-tokens`
(with `--required-batch-size-multiple 1`) at which it cuts an epoch into as few batches
as nmt's budget does (modelled here with nmt's batching, checked against fairseq's log):
the same number of updates an epoch, so the same mean of target tokens an update; both
are printed.

Each system runs in a process of its own, `taskset -c CORE`, OMP_NUM_THREADS=1 (and
`train.threads = 1` for nmt), for the same time (`--minutes`) or number of updates
(`--updates`), without validation or checkpoints while timed (nmt validates once after
its limit, untimed), logging every 20 updates; they alternate (nmt, fairseq, nmt,
fairseq, ... for `--rounds`) so that a drift of the host's speed falls on both. A run's
throughput is the median over its 20-update intervals that start after `--skip` updates
(warm-up); a system's, the median over the rounds:

- fairseq: its own `wps` of each interval (train_inner log records): the interval's
  target tokens (padding excluded, </s> included) over its wall-clock time.
- nmt: the same thing, from metrics.jsonl: the interval's target tokens (padding excluded,
  EOS included, recomputed from nmt's own batch plan, checked against the first updates
  nmt prints) over the change of its wall-clock `elapsed_s`. Also shown: nmt's own
  `tokens_per_s`, the same tokens over the sum of the 20 updates' own times (batch
  collation, forward, backward, Adam), which leaves out the per-update logging and stop
  checks around them.

Both train in fp32; `--nmt-precision bf16` (or `auto`) trains nmt in that precision
against fairseq's fp32, what each would run on a CPU with bf16 units. `--avx2` runs both
with the CPU capped at AVX2 (NMT_CPU_LEVEL=avx2 for nmt, and
ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS for both; see
nmt_cli/cpu_level.py). fairseq runs from a Python of its own that sees nmt's torch
through a .pth file (bench/import_check_fairseq.py says how to make one; fairseq 0.12's
imports also want scikit-learn, scipy, threadpoolctl and narwhals there, installed with
--no-deps):

    .venv/bin/python bench/bench_train_fairseq.py --fairseq-python FAIRSEQ_VENV/bin/python \\
        --corpus DIR --core 0 --minutes 5 --rounds 2
    .venv/bin/python bench/bench_train_fairseq.py --fairseq-python FAIRSEQ_VENV/bin/python \\
        --corpus DIR --core 0 --minutes 5 --avx2 --work WORK

(DIR: raw parallel text as `nmt prepare PRESET --from DIR` reads it, e.g. a local copy of
Multi30k: train/val/test_2016_flickr.{en,de}.gz.) With `--work` the prepared data and
the runs' logs are kept there (prepare is skipped when done); otherwise in a temporary
directory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq_work import run_beside_fairseq

from nmt_cli.config import RecipeConfig, load_recipe
from nmt_cli.core.batching import length_grouped_batches, plan_epoch
from nmt_cli.cpu_level import cpuinfo_field, torch_environment
from nmt_cli.data_dir import PreparedData, open_data_dir
from nmt_cli.engines.train.events import BatchSplit
from nmt_cli.engines.train.feed import derive_split

INTERVAL = 20  # updates between log records: the window of nmt's own tokens_per_s


def run(command: list[str], extra: dict[str, str], log: Path | None = None) -> str:
    """Run `command` with `extra` added to the environment, printing both as a shell line;
    its standard output and error together, also written to `log` when given."""
    print("$", shlex.join([f"{k}={v}" for k, v in extra.items()] + command), flush=True)
    done = subprocess.run(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, **extra),
    )
    if log is not None:
        log.write_text(done.stdout, encoding="utf-8")
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return done.stdout


def environment(args: argparse.Namespace, system: str) -> dict[str, str]:
    """What each system's processes get: one OpenMP thread, the AVX2 cap with --avx2, and
    for fairseq torch.load as fairseq 0.12 expects it (torch >= 2.6 loads weights only)."""
    extra = {"OMP_NUM_THREADS": "1"}
    if system == "fairseq":
        extra["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    if args.avx2:
        if system == "nmt":
            extra["NMT_CPU_LEVEL"] = "avx2"
        extra.update(torch_environment("avx2"))
    return extra


def pinned(args: argparse.Namespace, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(args.core), *command]


@dataclass
class Figures:
    """One training run's steady-state figures (medians over its kept intervals)."""

    tokens_per_s: float  # wall clock: nmt from elapsed_s, fairseq its wps
    own_tokens_per_s: float | None  # nmt's own tokens_per_s (its updates' time)
    tokens_per_update: float
    intervals: int
    updates: int
    batches_per_epoch: int = 0  # fairseq: its log's (total_num_itrs)


def prepare(args: argparse.Namespace, work: Path, recipe: RecipeConfig) -> Path:
    """`nmt prepare` of the recipe's preset from --corpus (skipped where already done)."""
    data = work / (f"data-{args.pairs}" if args.pairs else "data")
    if not recipe.data.preset:
        raise SystemExit(f"{args.recipe}: no data.preset to prepare --corpus with")
    command = [sys.executable, "-m", "nmt_cli", "prepare", recipe.data.preset,
               "--from", str(args.corpus), "--out", str(data), "--workers", "1", "-q"]  # fmt: skip
    if args.pairs:
        command += ["--max-pairs", str(args.pairs)]
    run(pinned(args, command), environment(args, "nmt"))
    return data


def export_for_fairseq(
    args: argparse.Namespace, work: Path, data: PreparedData, fairseq: list[str]
) -> Path:
    """nmt's pieces of the training and dev sets as text, every piece of its vocabulary as
    one dictionary, and fairseq-preprocess of them: fairseq's binarized data."""
    if not data.vocab.joint:
        raise SystemExit("fairseq's shared embeddings need nmt's joint vocabulary")
    vocab = data.vocab.src
    pieces = vocab.pieces(range(len(vocab)))
    if pieces[:4] != ["<pad>", "<unk>", "<s>", "</s>"]:
        raise SystemExit(f"unexpected special pieces {pieces[:4]}")
    text = work / "fairseq-text"
    text.mkdir(parents=True, exist_ok=True)
    # fairseq's dictionary adds its own four specials first: 4 + 7,996 = nmt's 8,000
    dictionary = text / "dict.txt"
    dictionary.write_text("".join(f"{p} 1\n" for p in pieces[4:]), encoding="utf-8")
    src, tgt = data.src_lang, data.tgt_lang
    for split in ("train", "valid"):
        stores = dict(zip((src, tgt), data.split(split), strict=True))
        for lang, store in stores.items():
            lines = (" ".join(pieces[i] for i in store[n].tolist()) for n in range(len(store)))
            (text / f"{split}.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8"
            )
    binarized = work / "fairseq-bin"
    shutil.rmtree(binarized, ignore_errors=True)
    out = run(
        pinned(args, [*fairseq, "fairseq_cli.preprocess", "--source-lang", src,
                      "--target-lang", tgt, "--trainpref", str(text / "train"),
                      "--validpref", str(text / "valid"), "--destdir", str(binarized),
                      "--srcdict", str(dictionary), "--joined-dictionary",
                      "--workers", "1"]),
        environment(args, "fairseq"),
        work / "fairseq-preprocess.log",
    )  # fmt: skip
    replaced = re.findall(r"([\d.]+)% replaced", out)
    if any(float(r) > 0 for r in replaced):
        print(f"warning: fairseq-preprocess replaced pieces by <unk>: {replaced} %")
    return binarized


@dataclass
class Batching:
    split: BatchSplit  # nmt's on one device: padded budget a batch, batches an update
    nmt_batches: int  # an epoch
    fairseq_max_tokens: int
    fairseq_batches: int  # an epoch, as modelled here


def batching(recipe: RecipeConfig, data: PreparedData) -> Batching:
    """nmt's batch split, and the smallest --max-tokens at which fairseq cuts an epoch
    into no more batches than nmt does, so that its updates carry as many target tokens
    on average. fairseq batches as nmt does but sorts by source length first, then target
    (LanguagePairDataset.ordered_indices): nmt's batching with the sides swapped."""
    src, tgt = data.split("train")
    split = derive_split(recipe.train, 1, src.lengths, tgt.lengths)
    seed = recipe.train.seed
    ours = len(length_grouped_batches(src.lengths, tgt.lengths, split.max_tokens, seed, 0))
    budget = split.max_tokens
    while True:
        theirs = len(length_grouped_batches(tgt.lengths, src.lengths, budget, seed, 0))
        if theirs <= ours or budget >= 2 * split.max_tokens:
            return Batching(split, ours, budget, theirs)
        budget += 1


def nmt_update_tokens(
    recipe: RecipeConfig, data: PreparedData, split: BatchSplit, updates: int
) -> list[int]:
    """Target tokens of nmt's first `updates` updates, epoch after epoch, from the plan
    `nmt train` makes (nmt_cli/engines/train/feed.py: the same seed, epochs from 0)."""
    src, tgt = data.split("train")
    tokens: list[int] = []
    epoch = 0
    while len(tokens) < updates:
        plan = plan_epoch(
            src.lengths, tgt.lengths, split.max_tokens, recipe.train.seed, epoch,
            split.world, split.accum,
        )  # fmt: skip
        tokens += [plan.update_tgt_tokens(u) for u in range(plan.updates)]
        epoch += 1
    return tokens[:updates]


def limits(args: argparse.Namespace) -> tuple[float, int]:
    """(minutes, updates) of one run: one of the two, the other 0."""
    return (0.0, args.updates) if args.updates else (args.minutes, 0)


def train_nmt(
    args: argparse.Namespace,
    work: Path,
    data_dir: Path,
    recipe: RecipeConfig,
    data: PreparedData,
    batches: Batching,
    round_: int,
) -> Figures:
    minutes, updates = limits(args)
    run_dir = work / f"nmt-{round_}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory left would be resumed
    settings = [
        f"data.dir={data_dir}",
        f"train.precision={args.nmt_precision}",
        "train.threads=1",
        f"train.max_time_minutes={minutes}",
        f"train.max_steps={updates}",
        f"train.log_interval_steps={INTERVAL}",
        "train.save_interval_minutes=0",
        "train.save_interval_steps=0",
        "train.tensorboard=false",
        "train.validate_bleu_sentences=0",
    ]
    command = [sys.executable, "-m", "nmt_cli", "train", str(args.recipe), "--procs", "1",
               "--run-dir", str(run_dir)]  # fmt: skip
    for setting in settings:
        command += ["--set", setting]
    out = run(pinned(args, command), environment(args, "nmt"), work / f"nmt-{round_}.log")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    if not train:
        raise SystemExit(f"nmt logged no training record: see {work / f'nmt-{round_}.log'}")
    done = max(r["step"] for r in records)  # the final validation's record has the last
    tokens = nmt_update_tokens(recipe, data, batches.split, done)
    said = re.search(r"first updates: (.*)", out)
    told = re.findall(r"/ ([\d,]+) target", said.group(1) if said else "")
    if not told or [int(n.replace(",", "")) for n in told] != tokens[: len(told)]:
        raise SystemExit(
            f"nmt's first updates ({told}) are not the plan recomputed here "
            f"({tokens[:3]}): nmt_update_tokens no longer follows nmt train's feed"
        )
    wall, own = [], []
    for before, after in itertools.pairwise(train):
        if before["step"] < args.skip or after["step"] - before["step"] != INTERVAL:
            continue
        counted = sum(tokens[before["step"] : after["step"]])
        wall.append(counted / (after["elapsed_s"] - before["elapsed_s"]))
        own.append(after["tokens_per_s"])
    if not wall:
        raise SystemExit(
            f"nmt: no {INTERVAL}-update interval after the first {args.skip} updates "
            f"({done} updates in all): give it more --minutes"
        )
    return Figures(
        statistics.median(wall),
        statistics.median(own),
        statistics.mean(tokens),
        len(wall),
        done,
    )


def train_fairseq(
    args: argparse.Namespace,
    work: Path,
    binarized: Path,
    recipe: RecipeConfig,
    batches: Batching,
    fairseq: list[str],
    round_: int,
) -> Figures:
    minutes, updates = limits(args)
    m, t = recipe.model, recipe.train
    # nmt's rate (equation 3) peaks at d_model^-0.5 * warmup^-0.5: inverse_sqrt's --lr
    peak = m.d_model**-0.5 * t.warmup_steps**-0.5 * t.lr_scale
    save_dir = work / f"fairseq-{round_}"
    shutil.rmtree(save_dir, ignore_errors=True)
    command = [*fairseq, "fairseq_cli.train", str(binarized), "--arch", "transformer",
               "--encoder-layers", str(m.encoder_layers),
               "--decoder-layers", str(m.decoder_layers),
               "--encoder-embed-dim", str(m.d_model), "--decoder-embed-dim", str(m.d_model),
               "--encoder-ffn-embed-dim", str(m.d_ff), "--decoder-ffn-embed-dim", str(m.d_ff),
               "--encoder-attention-heads", str(m.n_heads),
               "--decoder-attention-heads", str(m.n_heads), "--share-all-embeddings",
               "--dropout", str(m.dropout), "--attention-dropout", str(m.attention_dropout),
               "--activation-dropout", str(m.relu_dropout),
               "--optimizer", "adam", "--adam-betas", f"({t.adam_beta1}, {t.adam_beta2})",
               "--adam-eps", str(t.adam_eps), "--lr", f"{peak:.6g}",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(t.warmup_steps),
               "--criterion", "label_smoothed_cross_entropy",
               "--label-smoothing", str(t.label_smoothing),
               "--max-tokens", str(batches.fairseq_max_tokens),
               "--update-freq", str(batches.split.accum),
               "--required-batch-size-multiple", "1", "--cpu", "--seed", str(t.seed),
               "--num-workers", "0", "--disable-validation", "--no-save",
               "--save-dir", str(save_dir), "--log-format", "json",
               "--log-interval", str(INTERVAL)]  # fmt: skip
    if updates:
        command += ["--max-update", str(updates)]
    else:
        command += ["--stop-time-hours", f"{minutes / 60:.6g}"]
    out = run(pinned(args, command), environment(args, "fairseq"), work / f"fairseq-{round_}.log")
    records = [json.loads(x) for x in re.findall(r"\| train_inner \| (\{.*\})", out)]
    if not records:
        raise SystemExit(f"fairseq logged no train_inner record: see {work}/fairseq-{round_}.log")
    last = int(records[-1]["num_updates"])
    kept = [r for r in records if int(r["num_updates"]) - INTERVAL >= args.skip]
    if not kept:
        raise SystemExit(
            f"fairseq: no {INTERVAL}-update interval after the first {args.skip} updates "
            f"({last} updates in all): give it more --minutes"
        )
    wps = statistics.median(float(r["wps"]) for r in kept)
    wpb = statistics.mean(float(r["wpb"]) for r in records)
    done = max(int(n) for n in re.findall(r'num_updates": "(\d+)"', out))  # the epoch's too
    per_epoch = re.search(r"total_num_itrs = (\d+)", out)
    return Figures(wps, None, wpb, len(kept), done, int(per_epoch.group(1)) if per_epoch else 0)


def fairseq_version(python: Path) -> str:
    code = (
        "import importlib.metadata as m\n"
        "for name in ('fairseq', 'fairseq-fixed'):\n"
        "    try:\n        print(name, m.version(name)); break\n"
        "    except m.PackageNotFoundError: pass"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "fairseq (version unknown)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fairseq-python", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="raw parallel text")
    parser.add_argument("--recipe", type=Path, default=Path("recipes/multi30k-en-de.toml"))
    parser.add_argument("--core", type=int, default=0, help="the CPU both systems run on")
    parser.add_argument("--minutes", type=float, default=5.0, help="each run's training time")
    parser.add_argument("--updates", type=int, default=0, help="each run's updates instead")
    parser.add_argument("--rounds", type=int, default=1, help="nmt then fairseq, this often")
    parser.add_argument(
        "--skip", type=int, default=INTERVAL, help="warm-up updates left out of the figures"
    )
    parser.add_argument("--pairs", type=int, default=0, help="only N training pairs; 0 = all")
    parser.add_argument("--avx2", action="store_true", help="both capped at AVX2")
    parser.add_argument(
        "--nmt-precision", default="fp32", help="nmt's train.precision (fairseq: fp32)"
    )
    parser.add_argument("--work", type=Path, help="keep the work here (default: a temp dir)")
    run_beside_fairseq(parser.parse_args(), compare)


def compare(args: argparse.Namespace, work: Path, fairseq: list[str]) -> None:
    recipe = load_recipe(args.recipe)
    data_dir = prepare(args, work, recipe)
    data = open_data_dir(data_dir)
    binarized = export_for_fairseq(args, work, data, fairseq)
    batches = batching(recipe, data)
    results: dict[str, list[Figures]] = {"nmt": [], "fairseq": []}
    for r in range(args.rounds):
        results["nmt"].append(train_nmt(args, work, data_dir, recipe, data, batches, r))
        results["fairseq"].append(train_fairseq(args, work, binarized, recipe, batches, fairseq, r))
    split = batches.split
    limit = f"{args.updates} updates" if args.updates else f"{args.minutes:g} minutes"
    logged = sorted({f.batches_per_epoch for f in results["fairseq"]})
    print(
        f"\n{cpuinfo_field('model name') or 'CPU'}, core {args.core}, one thread, nmt "
        f"{args.nmt_precision}, fairseq fp32"
        f"{', capped at AVX2' if args.avx2 else ''}; torch {torch.__version__}, "
        f"{fairseq_version(args.fairseq_python)}"
    )
    print(
        f"{len(data.split('train')[0]):,} training pairs, vocabulary {len(data.vocab.src):,}; "
        f"{limit} a run, the first {args.skip} updates left out; {split.accum} batch(es) an "
        f"update; nmt: batches of <= {split.max_tokens:,} padded tokens (sentences x longest "
        f"side; batch_tokens {recipe.train.batch_tokens:,} real), {batches.nmt_batches} an "
        f"epoch; fairseq: --max-tokens {batches.fairseq_max_tokens:,}, "
        f"{batches.fairseq_batches} an epoch (its log: {', '.join(map(str, logged))})"
    )
    print(
        "\n| round | nmt tgt tok/s (wall clock) | nmt's own tok/s | fairseq wps | "
        "nmt / fairseq | tgt tokens an update, nmt / fairseq | updates, nmt / fairseq |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r, (ours, theirs) in enumerate(zip(results["nmt"], results["fairseq"], strict=True)):
        print(
            f"| {r + 1} | {ours.tokens_per_s:,.0f} | {ours.own_tokens_per_s or 0:,.0f} | "
            f"{theirs.tokens_per_s:,.0f} | {ours.tokens_per_s / theirs.tokens_per_s:.2f}x | "
            f"{ours.tokens_per_update:,.0f} / {theirs.tokens_per_update:,.0f} | "
            f"{ours.updates} / {theirs.updates} |"
        )
    nmt = statistics.median(f.tokens_per_s for f in results["nmt"])
    peer = statistics.median(f.tokens_per_s for f in results["fairseq"])
    print(
        f"\nmedian over {args.rounds} round(s): nmt {nmt:,.0f} target tokens/s, fairseq "
        f"{peer:,.0f}: nmt / fairseq {nmt / peer:.2f}x"
    )
    print(
        "(target tokens with the end of sentence, without padding, for both; tokens an "
        "update: nmt's mean over the updates it ran, from its plan; fairseq's mean wpb of "
        "its intervals)"
    )


if __name__ == "__main__":
    main()
