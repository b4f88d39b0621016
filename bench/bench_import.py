"""Beam-4 decoding speed and quality of an imported model: `nmt translate` on what
`nmt import --from huggingface` made of a MarianMT directory, against the same directory
in transformers (`generate`), same run, same sentences.

    # an OPUS-MT or Tatoeba directory (e.g. Helsinki-NLP/opus-mt-en-de, downloaded):
    python bench/bench_import.py DIR/test_2016_flickr.en.gz --ref DIR/test_2016_flickr.de.gz \\
        --marian opus-mt-en-de
    # or a Multi30k checkpoint trained by nmt, exported to MarianMT first:
    python bench/bench_import.py DIR/test_2016_flickr.en.gz --ref DIR/test_2016_flickr.de.gz \\
        --model runs/multi30k-en-de/checkpoints/best.pt

(DIR: a local copy of Multi30k.) The MarianMT directory is imported with `nmt import`
into a temporary directory; each system then runs in a process of its own, pinned to
the first `threads` cores and timed around tokenization, decoding and detokenization
after a warm-up (peer_launch.py, peer_worker.py: the layouts of bench_export.py), at
batch 128 on the test set and batch 1 on its first `--single` sentences. sacreBLEU
scores each batch-128 output; `agree` is the share of sentences whose translation is
the same text as transformers'. Length penalties differ (nmt's GNMT ((5 + |Y|) / 6) **
0.6, transformers' |Y| ** 0.6), so beam-4 outputs may differ where the penalty decides;
greedy outputs are identical (tests/integration/test_import_huggingface.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shlex
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import sacrebleu
from peer_launch import Layout, run_worker, usable_cores, worker_command

from nmt_cli.text_io import read_lines


def nmt(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "nmt_cli", *args, "-q"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path)
    parser.add_argument("--ref", type=Path, required=True, help="reference (gz)")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--marian", type=Path, help="a transformers MarianMT directory")
    model.add_argument("--model", type=Path, help="an nmt checkpoint, exported first")
    parser.add_argument("--single", type=int, default=200, help="sentences at batch 1")
    parser.add_argument("--threads", type=int, default=0, help="0 = every core")
    parser.add_argument("--precisions", default="fp32", help="nmt's, comma-separated")
    args = parser.parse_args()
    print("command:", shlex.join(["python", *sys.argv]))
    layout = Layout.first(args.threads or len(usable_cores()))
    threads = layout.n
    lines, refs = read_lines(args.test_src), read_lines(args.ref)
    print(
        f"{date.today()}, {platform.processor() or platform.machine()}, {threads} threads "
        f"(pinned to cores {layout.cpu_list}), torch {importlib.metadata.version('torch')}, "
        f"transformers {importlib.metadata.version('transformers')}; "
        f"{len(lines)} test sentences, beam 4"
    )
    metric = sacrebleu.BLEU()
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        marian = args.marian
        if marian is None:
            marian = tmp / "marian"
            nmt("export", str(args.model), str(marian), "--to", "huggingface")
        imported = tmp / "imported.pt"
        nmt("import", "--from", "huggingface", str(marian), "-o", str(imported))
        inputs = {128: tmp / "lines-all.txt", 1: tmp / "lines-single.txt"}
        for batch, subset in ((128, lines), (1, lines[: args.single])):
            inputs[batch].write_text("".join(line + "\n" for line in subset), encoding="utf-8")
        systems = {
            f"nmt {p} (imported)": ("peer_nmt.py", imported, {"precision": p})
            for p in args.precisions.split(",")
        }
        systems["transformers float32"] = ("peer_transformers.py", marian, {})
        outputs: dict[str, list[str]] = {}
        for system, (script, path, flags) in systems.items():
            rates = {}
            for batch, source in inputs.items():
                output = tmp / "out.txt"
                command = worker_command(
                    script, path, source, output, batch=batch, threads=threads,
                    warmup=max(8, batch * threads), **flags,
                )  # fmt: skip
                done = run_worker(command, output, layout)
                rates[batch] = done.report["lines"] / done.report["seconds"]
                outputs.setdefault(system, done.outputs)
                print(f"  {done.command}\n  {done.describe()}")
            bleu = metric.corpus_score(outputs[system], [refs]).score
            rows.append((system, rates[128], rates[1], bleu))
            print(f"{system}: {rates[128]:.1f} / {rates[1]:.1f} sent/s, sacreBLEU {bleu:.1f}")
    theirs = outputs["transformers float32"]
    print("\n| system | batch 128 sent/s | batch 1 sent/s | sacreBLEU | agree |")
    print("|---|---:|---:|---:|---:|")
    for system, batch_rate, single_rate, bleu in rows:
        same = sum(a == b for a, b in zip(outputs[system], theirs, strict=True)) / len(theirs)
        print(f"| {system} | {batch_rate:.1f} | {single_rate:.1f} | {bleu:.1f} | {same:.1%} |")
    print(f"sacreBLEU signature: {metric.get_signature()}")


if __name__ == "__main__":
    main()
