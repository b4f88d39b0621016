"""Is a change slower? `nmt train` and `nmt translate` of two git revisions, in one run.

Each revision is checked out into a temporary worktree and run with this environment's
Python (its packages, that revision's `nmt_cli` first on PYTHONPATH). Both train the
demo recipe's model for the same number of steps on the same prepared data, then
translate the same test set with the same checkpoint (beam 4, fp32 and bf16). A and B
run side by side, one thread each, so that the host's drift and any other load hit both
alike. Prints the median target tokens/s of training, the sentences/s of decoding, and
B/A ratios.

    .venv/bin/python bench/compare_revisions.py 68ba359 HEAD --rounds 3

With `--model` (a trained checkpoint) and `--source` (text to translate, plain or .gz),
only decoding is compared, on that model and text: every precision of `--precisions`
at every batch size of `--batch-sizes` (batch 1 on the first `--single` lines), at the
default output length:

    .venv/bin/python bench/compare_revisions.py 483569c HEAD \
        --model runs/multi30k-en-de/average.pt --source DIR/test_2016_flickr.en.gz
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nmt_cli.text_io import read_lines

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, tree: Path | None = None) -> str:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


NMT = [sys.executable, "-c", "from nmt_cli.cli import main; main()"]


def train_rate(tree: Path, work: Path, data: Path, steps: int, precision: str, tag: str) -> float:
    run_dir = work / f"run-{tag}"
    settings = [
        f"data.dir={data}",
        f'train.precision="{precision}"',
        f"train.run_dir={run_dir}",
        f"train.max_steps={steps}",
        "train.max_time_minutes=0",
        "train.save_interval_minutes=0",
        "train.save_interval_steps=0",
        "train.log_interval_steps=5",
        "train.validate_bleu_sentences=0",
        "train.threads=1",
    ]
    cmd = [*NMT, "train", str(ROOT / "recipes/demo.toml")]
    for item in settings:
        cmd += ["--set", item]
    run(cmd, work, tree)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if r["type"] == "train" and r["step"] > 10]
    return statistics.median(rates)


def translate_rate(
    tree: Path, work: Path, model: Path, test: Path, precision: str, extra: tuple[str, ...] = ()
) -> float:
    """Sentences/s of one `nmt translate` process, as its closing summary reports them
    (decoding only: start-up and model loading are not counted)."""
    cmd = [*NMT, "translate", "-m", str(model), "-i", str(test), "-o", os.devnull]
    cmd += ["--precision", precision, "--threads", "1", *extra]
    summary = re.search(r"\(([\d.,]+) sent/s", run(cmd, work, tree))
    if summary is None:
        sys.exit(f"no speed in the summary of {shlex.join(cmd)}")
    return float(summary.group(1).replace(",", ""))


def side_by_side(
    pool: ThreadPoolExecutor, trees: dict[str, Path], rate: Callable[[str, Path], float]
) -> dict[str, float]:
    """`rate(name, tree)` of every revision at once, one per core."""
    return dict(zip(trees, pool.map(lambda name: rate(name, trees[name]), trees), strict=True))


def decode_rounds(
    args: argparse.Namespace, pool: ThreadPoolExecutor, trees: dict[str, Path], work: Path
) -> dict[str, dict[str, list[float]]]:
    """Decoding only: the given model on the given text, each precision and batch size."""
    lines = read_lines(args.source)
    tests = {}
    for batch in args.batch_sizes:
        tests[batch] = work / f"source-{batch}.txt"
        chosen = lines[: args.single] if batch == 1 else lines
        tests[batch].write_text("".join(line + "\n" for line in chosen), encoding="utf-8")
    results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for _ in range(args.rounds):
        for precision in args.precisions:
            for batch, test in tests.items():
                extra = ("--batch-size", str(batch))

                def decode(
                    _: str,
                    tree: Path,
                    p: str = precision,
                    t: Path = test,
                    e: tuple[str, ...] = extra,
                ) -> float:
                    return translate_rate(tree, work, args.model, t, p, e)

                for name, sent in side_by_side(pool, trees, decode).items():
                    results[name].setdefault(f"{precision} batch {batch} sent/s", []).append(sent)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--train-precision",
        default="auto",
        help="training precision (auto: bf16 where the CPU multiplies in it, else fp32)",
    )
    parser.add_argument("--model", type=Path, help="decoding only: this trained checkpoint")
    parser.add_argument("--source", type=Path, help="decoding only: the text to translate")
    parser.add_argument(
        "--precisions",
        help="decoding precisions (default fp32,bf16,int8 with --model, else fp32,bf16)",
    )
    parser.add_argument("--batch-sizes", default="64,1")
    parser.add_argument("--single", type=int, default=200, help="lines decoded at batch 1")
    args = parser.parse_args()
    default = "fp32,bf16,int8" if args.model is not None else "fp32,bf16"
    args.precisions = (args.precisions or default).split(",")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if (args.model is None) != (args.source is None):
        sys.exit("--model and --source go together")
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = {}
        for name, rev in (("A", args.rev_a), ("B", args.rev_b)):
            trees[name] = work / f"tree-{name}"
            run(["git", "worktree", "add", "--detach", str(trees[name]), rev], ROOT)
        try:
            if args.model is not None:
                args.model = args.model.resolve()
                with ThreadPoolExecutor(2) as pool:
                    report(args, decode_rounds(args, pool, trees, work))
                return
            data = work / "data"
            prep = [*NMT, "prepare", "demo", "--out", str(data)]
            run([*prep, "--max-pairs", "6000", "--vocab-size", "1000"], work, trees["B"])
            test = work / "test.en"
            lines = (data / "test.src.txt").read_text(encoding="utf-8").splitlines()[:400]
            test.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            ckpt = work / "run-A0" / "checkpoints" / "last.pt"
            results: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
            with ThreadPoolExecutor(2) as pool:
                for round_ in range(args.rounds):

                    def train(name: str, tree: Path, r: int = round_) -> float:
                        return train_rate(
                            tree, work, data, args.steps, args.train_precision, f"{name}{r}"
                        )

                    for name, rate in side_by_side(pool, trees, train).items():
                        results[name].setdefault("train tok/s", []).append(rate)
                    for precision in args.precisions:

                        def decode(_: str, tree: Path, p: str = precision) -> float:
                            return translate_rate(tree, work, ckpt, test, p, ("--max-len-b", "20"))

                        for name, sent in side_by_side(pool, trees, decode).items():
                            key = f"translate {precision} sent/s"
                            results[name].setdefault(key, []).append(sent)
        finally:
            for tree in trees.values():
                run(["git", "worktree", "remove", "--force", str(tree)], ROOT)
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, dict[str, list[float]]]) -> None:
    print(f"A = {args.rev_a}, B = {args.rev_b}; medians of {args.rounds} side-by-side rounds")
    for key in results["A"]:
        a, b = statistics.median(results["A"][key]), statistics.median(results["B"][key])
        print(f"{key:28s} A {a:10.1f}  B {b:10.1f}  B/A {b / a:5.2f}")


if __name__ == "__main__":
    main()
