"""Beam-4 decoding speed and quality: `nmt translate` vs its CTranslate2 and transformers exports.

    nmt run recipes/multi30k-en-de.toml      # a trained Multi30k EN-DE model
    python bench/bench_export.py DIR/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/checkpoints/best.pt \\
        --ref DIR/test_2016_flickr.de.gz

(DIR: a local copy of Multi30k.) Exports the checkpoint with `nmt export` (CTranslate2,
decoded in float32 and in int8; transformers MarianMT float32) into a temporary
directory, then times beam 4 on the test set at batch 128 and on its first `--single`
sentences at batch 1, every system in this one run with the same threads, and scores each
batch-128 output with sacreBLEU. Every system runs in a process of its own, pinned with
taskset to the first `threads` cores (peer_launch.py; the CTranslate2 worker never
imports torch), and is timed around its own tokenization, decoding and detokenization
after a warm-up of max(8, batch x threads) lines, model load and file I/O not included
(peer_worker.py). Layouts: nmt and CTranslate2 decode `threads` batches side by side, one
thread each (nmt's default on a small CPU; CTranslate2's inter_threads); transformers
decodes one batch on all threads.
Length penalties differ by system: nmt's GNMT ((5 + |Y|) / 6) ** 0.6, CTranslate2's and
transformers' |Y| ** 0.6. The output limit is nmt's |source| + 50
tokens per sentence; the others take one limit per call, so they get 50 + the longest
source of the batch. CTranslate2 decodes the batches nmt cuts (peer_ct2.py). Prints the
figures and the exact command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shlex
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import sacrebleu
from peer_ct2 import export
from peer_launch import Layout, run_worker, usable_cores, worker_command

from nmt_cli.text_io import read_lines


def systems(
    args: argparse.Namespace, ct2_dir: Path, hf_dir: Path
) -> dict[str, tuple[str, Path, dict[str, Any]]]:
    """Each system's worker script, model and own flags."""
    found: dict[str, tuple[str, Path, dict[str, Any]]] = {
        f"nmt {p}": ("peer_nmt.py", args.model, {"precision": p}) for p in args.precisions
    }
    for compute_type in ("float32", "int8"):
        found[f"ctranslate2 {compute_type}"] = (
            "peer_ct2.py",
            ct2_dir,
            {"compute_type": compute_type},
        )
    found["transformers float32"] = ("peer_transformers.py", hf_dir, {})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--ref", type=Path, required=True, help="reference (gz)")
    parser.add_argument("--single", type=int, default=200, help="sentences at batch 1")
    parser.add_argument("--threads", type=int, default=0, help="0 = every core")
    parser.add_argument("--precisions", default="bf16,fp32", help="nmt's, comma-separated")
    parser.add_argument("--skip", default="", help="comma list of systems to leave out")
    args = parser.parse_args()
    args.precisions = [p for p in args.precisions.split(",") if p]
    print("command:", shlex.join(["python", *sys.argv]))
    layout = Layout.first(args.threads or len(usable_cores()))
    threads = layout.n
    lines, refs = read_lines(args.test_src), read_lines(args.ref)
    print(
        f"{date.today()}, {platform.processor() or platform.machine()}, {threads} threads "
        f"(every process pinned to cores {layout.cpu_list}), torch "
        f"{importlib.metadata.version('torch')}; model {args.model}; "
        f"{len(lines)} test sentences, beam 4"
    )
    skip = set(filter(None, args.skip.split(",")))
    metric = sacrebleu.BLEU()
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        ct2_dir, hf_dir = tmp / "ct2", tmp / "hf"
        print("export:", export(args.model, ct2_dir))
        print("export:", export(args.model, hf_dir, to="huggingface"))
        inputs = {128: tmp / "lines-all.txt", 1: tmp / "lines-single.txt"}
        for batch, subset in ((128, lines), (1, lines[: args.single])):
            inputs[batch].write_text("".join(line + "\n" for line in subset), encoding="utf-8")
        for name, (script, model, flags) in systems(args, ct2_dir, hf_dir).items():
            if name in skip:
                continue
            rates, texts = {}, []
            for batch, path in inputs.items():
                output = tmp / "out.txt"
                command = worker_command(
                    script, model, path, output, batch=batch, threads=threads,
                    warmup=max(8, batch * threads), **flags,
                )  # fmt: skip
                done = run_worker(command, output, layout)
                report = done.report
                rates[batch] = report["lines"] / report["seconds"]
                texts = texts or done.outputs
                print(f"  {done.command}\n  {done.describe()}")
            bleu = metric.corpus_score(texts, [refs]).score
            rows.append((name, rates[128], rates[1], bleu))
            print(
                f"{name}: batch 128 {rates[128]:.1f} sent/s, batch 1 {rates[1]:.1f} sent/s, "
                f"sacreBLEU {bleu:.1f}",
                flush=True,
            )
    base = rows[0]
    print(f"\n| system | batch 128 sent/s | batch 1 sent/s | sacreBLEU | vs {base[0]} (128 / 1) |")
    print("|---|---:|---:|---:|---:|")
    for name, batch_rate, single_rate, bleu in rows:
        print(
            f"| {name} | {batch_rate:.1f} | {single_rate:.1f} | {bleu:.1f} | "
            f"{batch_rate / base[1]:.2f}x / {single_rate / base[2]:.2f}x |"
        )
    print(f"sacreBLEU signature: {metric.get_signature()}")


if __name__ == "__main__":
    main()
