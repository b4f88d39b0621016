"""`nmt import --from fairseq` against fairseq itself: train a small fairseq Transformer,
import it, and compare greedy outputs token for token (with their log-probabilities),
then beam-4 speed and sacreBLEU of `fairseq-generate` and `nmt translate`, same run,
same sentences.

fairseq does not install into nmt's environment (its pins are old), so it runs from a
Python of its own, e.g. a virtual environment with fairseq-fixed 0.12 that sees nmt's
torch through a .pth file:

    python3.11 -m venv /tmp/fairseq-venv
    echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > /tmp/fairseq-venv/lib/python3.11/site-packages/nmt.pth
    /tmp/fairseq-venv/bin/pip install --no-deps fairseq-fixed==0.12.3.1 hydra-core==1.3.2 \\
        omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 bitarray
    python bench/import_check_fairseq.py --fairseq-python /tmp/fairseq-venv/bin/python \\
        --corpus DIR

(DIR: raw parallel text, train/valid/test.{en,de}[.gz], e.g. a local copy of Multi30k.)
The text goes through Moses (sacremoses, fairseq's defaults) and a joint subword-nmt BPE,
fairseq-preprocess builds one joined dictionary, fairseq-train trains a small
post-norm Transformer with shared embeddings on the CPU in float32 (`--updates`), and
`nmt import --from fairseq` reads checkpoint_last.pt with the dictionaries and the codes.
Greedy: fairseq-generate --beam 1 on the binarized test set against nmt's greedy search
on the same raw sentences read through the imported Moses + BPE vocabulary. Beam 4:
fairseq's own timing line against `nmt translate`'s, and sacreBLEU of each detokenized
output. Length penalties differ (fairseq's --lenpen divides by |Y| ** a), so beam-4
outputs may differ where the penalty decides.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
from fairseq_work import run_beside_fairseq

from nmt_cli.text_io import read_lines


def run(command: list[str], env: dict[str, str] | None = None, both: bool = False) -> str:
    """The command's standard output (with `both`, followed by its standard error, where
    fairseq-generate logs its timing and nmt translate its summary)."""
    print("$", shlex.join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout + ("\n" + done.stderr if both else "")


def fairseq_env(threads: int) -> dict[str, str]:
    """fairseq's processes: `threads` OpenMP threads, and torch.load as fairseq 0.12 expects
    it (torch >= 2.6 loads weights only by default, which refuses the argparse Namespace
    fairseq stores in its checkpoints)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")


def split_file(corpus: Path, split: str, lang: str) -> Path:
    """The corpus file of a split; the dev set may be named valid, val or dev (Multi30k:
    val), the test set test_* (Multi30k: test_2016_flickr)."""
    names = {"valid": ("valid", "val", "dev")}.get(split, (split,))
    for stem in names:
        for name in (f"{stem}.{lang}", f"{stem}.{lang}.gz"):
            if (corpus / name).is_file():
                return corpus / name
    found = sorted(corpus.glob(f"{split}*.{lang}*"))
    if not found:
        raise SystemExit(f"{corpus}: no {split} file for {lang}")
    return found[0]


def tokenize(lines: list[str], lang: str) -> list[str]:
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang)
    return [
        tok.tokenize(x, aggressive_dash_splits=True, return_str=True, escape=True) for x in lines
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fairseq-python", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--pairs", type=int, default=10000, help="training pairs used")
    parser.add_argument("--updates", type=int, default=400)
    parser.add_argument("--merges", type=int, default=4000, help="BPE merges")
    parser.add_argument("--sentences", type=int, default=500, help="test sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, help="keep the work here (default: a temp dir)")
    parser.add_argument(
        "--reuse", action="store_true", help="with --work: keep a fairseq model trained there"
    )
    run_beside_fairseq(parser.parse_args(), check)


def check(args: argparse.Namespace, work: Path, fairseq: list[str]) -> None:
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    src, tgt = args.src, args.tgt
    limits = {"train": args.pairs, "valid": 1000, "test": args.sentences}
    raw: dict[tuple[str, str], list[str]] = {}
    for split, limit in limits.items():
        for lang in (src, tgt):
            raw[split, lang] = read_lines(split_file(args.corpus, split, lang))[:limit]
    tokenized = {key: tokenize(lines, key[1]) for key, lines in raw.items()}
    codes = io.StringIO()
    train = [line + "\n" for lang in (src, tgt) for line in tokenized["train", lang]]
    learn_bpe(train, codes, args.merges)
    model_dir = work / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()), separator="@@")
    for (split, lang), lines in tokenized.items():
        text = "".join(bpe.process_line(line) + "\n" for line in lines)
        (work / f"{split}.{lang}").write_text(text, encoding="utf-8")
    data = work / "bin"
    checkpoint = work / "checkpoints" / "checkpoint_last.pt"
    if args.reuse and checkpoint.is_file():
        print(f"reusing {checkpoint} (--reuse)")
    else:
        train_fairseq(args, work, fairseq, data)
    for lang in (src, tgt):
        (model_dir / f"dict.{lang}.txt").write_bytes((data / f"dict.{lang}.txt").read_bytes())
    imported = work / "imported.pt"
    run([sys.executable, "-m", "nmt_cli", "import", "--from", "fairseq", str(checkpoint),
         "--data-dir", str(model_dir), "-o", str(imported),
         "--src", src, "--tgt", tgt])  # fmt: skip
    greedy(args, work, fairseq, data, checkpoint, imported, raw["test", src])
    beam(args, work, fairseq, data, checkpoint, imported, raw)


def train_fairseq(args: argparse.Namespace, work: Path, fairseq: list[str], data: Path) -> None:
    """fairseq-preprocess (one joined dictionary) and fairseq-train of the small model."""
    src, tgt = args.src, args.tgt
    run([*fairseq, "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", str(work / "train"), "--validpref", str(work / "valid"),
         "--testpref", str(work / "test"), "--destdir", str(data), "--joined-dictionary",
         "--workers", "1"])  # fmt: skip
    started = time.perf_counter()
    run([*fairseq, "fairseq_cli.train", str(data), "--arch", "transformer",
         "--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
         "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
         "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--share-all-embeddings", "--dropout", "0.1",
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", "4000", "--max-update", str(args.updates), "--cpu", "--seed", "1",
         "--save-dir", str(work / "checkpoints"), "--no-epoch-checkpoints",
         "--num-workers", "0", "--log-interval", "50"],
        env=fairseq_env(args.threads))  # fmt: skip
    print(f"fairseq-train: {time.perf_counter() - started:.0f} s, {args.updates} updates")


def fairseq_generate(
    args: argparse.Namespace, fairseq: list[str], data: Path, checkpoint: Path, model_dir: Path
) -> str:
    """Beam 4 with fairseq's own Moses + BPE post-processing (the D lines); the languages
    given, since a checkpoint trained from the command line does not name them."""
    src, tgt = args.src, args.tgt
    return run([*fairseq, "fairseq_cli.generate", str(data), "--path", str(checkpoint),
                "--gen-subset", "test", "--source-lang", src, "--target-lang", tgt,
                "--beam", "4", "--cpu", "--batch-size", "128",
                "--max-len-a", "1", "--max-len-b", "50", "--tokenizer", "moses",
                "--bpe", "subword_nmt", "--bpe-codes", str(model_dir / "bpecodes"),
                "--remove-bpe"],
               env=fairseq_env(args.threads), both=True)  # fmt: skip


def by_id(text: str, kind: str) -> dict[int, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith(f"{kind}-"):
            head, _, rest = line.partition("\t")
            found[int(head[len(kind) + 1 :])] = rest
    return found


def greedy(
    args: argparse.Namespace,
    work: Path,
    fairseq: list[str],
    data: Path,
    checkpoint: Path,
    imported: Path,
    sources: list[str],
) -> None:
    """Token for token: fairseq's greedy hypotheses (H lines, before BPE removal, with
    P lines of per-token log2-probabilities) against nmt's greedy search."""
    import torch

    from nmt_cli.core.batching import pad_sources
    from nmt_cli.core.checkpoint import load_checkpoint
    from nmt_cli.core.search import greedy_search

    src, tgt = args.src, args.tgt
    out = run([*fairseq, "fairseq_cli.generate", str(data), "--path", str(checkpoint),
               "--gen-subset", "test", "--source-lang", src, "--target-lang", tgt,
               "--beam", "1", "--cpu", "--batch-size", "64",
               "--max-len-a", "1", "--max-len-b", "50"], env=fairseq_env(args.threads))  # fmt: skip
    hyps, scores = by_id(out, "H"), by_id(out, "P")
    ckpt = load_checkpoint(imported)
    model = ckpt.build_model()
    torch.set_num_threads(args.threads)
    kept = sorted(hyps)  # fairseq-generate leaves out a few sentences: compare the others
    same, cut, worst, total = 0, 0, 0.0, len(kept)
    for lo in range(0, total, 64):
        ids = ckpt.vocab.src.encode([sources[i] for i in kept[lo : lo + 64]])
        found = greedy_search(model, pad_sources(ids), max_len_a=1.0, max_len_b=50)
        for offset, hyp in enumerate(found):
            index = kept[lo + offset]
            theirs = hyps[index].split("\t")[-1].split()
            ours = ckpt.vocab.tgt.pieces(hyp[0].tokens)
            if ours == theirs:
                same += 1
                log_probs = [float(x) * math.log(2) for x in scores[index].split()]
                worst = max(worst, abs(sum(log_probs) - hyp[0].log_prob) / len(log_probs))
            elif len(ours) == len(ids[offset]) + 50 and theirs[: len(ours)] == ours:
                # nmt's limit is a * |source| + b per sentence; fairseq's counts the padded
                # batch's width (</s> included), so a runaway hypothesis runs on longer there
                cut += 1
    print(
        f"greedy: {same} of {total} test sentences (of {len(sources)}; the others "
        f"fairseq-generate left out) give fairseq's tokens, {cut} more its tokens up to "
        "nmt's length limit (fairseq's limit is the padded batch's); their "
        f"log-probabilities differ by at most {worst:.2e} per token"
    )


def beam(
    args: argparse.Namespace,
    work: Path,
    fairseq: list[str],
    data: Path,
    checkpoint: Path,
    imported: Path,
    raw: dict[tuple[str, str], list[str]],
) -> None:
    src, tgt = args.src, args.tgt
    out = fairseq_generate(args, fairseq, data, checkpoint, work / "model")
    detok = by_id(out, "D")
    kept = sorted(detok)  # the sentences fairseq-generate translated, for both systems
    refs = [raw["test", tgt][i] for i in kept]
    theirs = [detok[i].split("\t")[-1] for i in kept]
    timing = re.search(r"Translated .*? in ([\d.]+)s \(([\d.]+) sentences/s", out)
    source = work / "test.raw"
    source.write_text("".join(raw["test", src][i] + "\n" for i in kept), encoding="utf-8")
    report = run([sys.executable, "-m", "nmt_cli", "translate", "-m", str(imported),
                  "-i", str(source), "--precision", "fp32", "--threads", str(args.threads),
                  "--max-len-a", "1", "--max-len-b", "50"], both=True)  # fmt: skip
    ours = report.splitlines()[: len(kept)]
    rate = re.search(r"\(([\d.]+) sent/s", report)
    bleu = sacrebleu.BLEU()
    print(
        f"\n{len(kept)} sentences (fairseq-generate left out {len(raw['test', src]) - len(kept)})"
    )
    print("| system | sent/s (decoding, loading not counted) | sacreBLEU |")
    print("|---|---:|---:|")
    if timing:
        print(f"| fairseq-generate beam 4 | {float(timing.group(2)):.1f} | "
              f"{bleu.corpus_score(theirs, [refs]).score:.1f} |")  # fmt: skip
    if rate:
        print(f"| nmt translate beam 4, imported | {float(rate.group(1)):.1f} | "
              f"{bleu.corpus_score(ours, [refs]).score:.1f} |")  # fmt: skip
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(refs)
    print(f"same text: {agree:.1%}; sacreBLEU signature: {bleu.get_signature()}")


if __name__ == "__main__":
    main()
