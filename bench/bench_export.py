"""Beam-4 decoding speed and quality: `nmt translate` vs its CTranslate2 and transformers exports.

    nmt run recipes/multi30k-en-de.toml      # a trained Multi30k EN-DE model
    python bench/bench_export.py DIR/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/checkpoints/best.pt \\
        --ref DIR/test_2016_flickr.de.gz

(DIR: a local copy of Multi30k.) Exports the checkpoint with `nmt export` (CTranslate2
float32 and int8, transformers MarianMT float32) into a temporary directory, then times
beam 4 on the test set at batch 128 and on its first `--single` sentences at batch 1,
every system in this one run with the same threads, and scores each batch-128 output with
sacreBLEU. Layouts: nmt and CTranslate2 decode `threads` batches side by side, one thread
each (nmt's default on a small CPU; CTranslate2's inter_threads); transformers decodes one
batch on all threads. Length penalties differ by system: nmt's GNMT ((5 + |Y|) / 6) **
0.6, CTranslate2's and transformers' |Y| ** 0.6. The output limit is nmt's |source| + 50
tokens per sentence; the others take one limit per call, so they get 50 + the longest
source of the batch. CTranslate2 decodes the batches nmt cuts (peer_ct2.py). Prints the
figures and the exact command.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import sacrebleu
import torch
from peer_ct2 import Ct2Decoder

from nmt_cli import Translator
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.cpus import usable_cpus
from nmt_cli.core.precision import DecodePrecisionSetting
from nmt_cli.engines.export.run import ExportConfig, export_model
from nmt_cli.text_io import read_lines

Decode = Callable[[list[str], int], list[str]]  # (lines, batch size) -> translations


def nmt_decoder(model: Path, precision: DecodePrecisionSetting, threads: int) -> Decode:
    translators: dict[int, Translator] = {}  # one per batch size, loaded before timing

    def decode(lines: list[str], batch: int) -> list[str]:
        if batch not in translators:
            translators[batch] = Translator.load(
                model, precision=precision, batch_sentences=batch, threads=threads, device="cpu"
            )
        return [r.text for r in translators[batch].translate(lines)]

    return decode


def ctranslate2_decoder(model_dir: Path, compute_type: str, threads: int) -> Decode:
    """CTranslate2 on the batches nmt cuts, `threads` of them side by side (peer_ct2.py)."""
    peer = Ct2Decoder(model_dir, compute_type, threads)
    return lambda lines, batch: [out.text for out in peer.translate(lines, batch)]


def transformers_decoder(model_dir: Path, threads: int) -> Decode:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()

    def decode(lines: list[str], batch: int) -> list[str]:
        torch.set_num_threads(threads)
        order = sorted(range(len(lines)), key=lambda i: -len(lines[i]))  # less padding
        out: dict[int, str] = {}
        for lo in range(0, len(order), batch):
            index = order[lo : lo + batch]
            inputs = tokenizer([lines[i] for i in index], return_tensors="pt", padding=True)
            limit = 50 + inputs["input_ids"].size(1) - 1  # the longest source, without </s>
            with torch.inference_mode():
                ids = model.generate(
                    **inputs, num_beams=4, length_penalty=0.6, max_new_tokens=limit + 1
                )
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            out.update(zip(index, texts, strict=True))
        return [out[i] for i in range(len(lines))]

    return decode


def timed(decode: Decode, lines: list[str], batch: int) -> tuple[float, list[str]]:
    decode(lines[:8], batch)  # warm-up: loading, kernels, allocators
    start = time.perf_counter()
    texts = decode(lines, batch)
    return len(lines) / (time.perf_counter() - start), texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--ref", type=Path, required=True, help="reference (gz)")
    parser.add_argument("--single", type=int, default=200, help="sentences at batch 1")
    parser.add_argument("--threads", type=int, default=0, help="0 = every core")
    parser.add_argument("--skip", default="", help="comma list of systems to leave out")
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    threads = args.threads or usable_cpus()
    lines, refs = read_lines(args.test_src), read_lines(args.ref)
    ckpt = load_checkpoint(args.model)
    cfg = ckpt.model_config
    print(
        f"{date.today()}, {platform.processor() or platform.machine()}, {threads} threads, "
        f"torch {torch.__version__}; model {args.model} (step {ckpt.step}, "
        f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}); "
        f"{len(lines)} test sentences, beam 4"
    )
    skip = set(filter(None, args.skip.split(",")))
    metric = sacrebleu.BLEU()
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir, hf_dir = Path(tmp) / "ct2", Path(tmp) / "hf"
        export_model(ExportConfig(args.model, ct2_dir, "ctranslate2"))
        export_model(ExportConfig(args.model, hf_dir, "huggingface"))
        systems: dict[str, Callable[[], Decode]] = {
            "nmt bf16": lambda: nmt_decoder(args.model, "bf16", threads),
            "nmt fp32": lambda: nmt_decoder(args.model, "fp32", threads),
            "ctranslate2 float32": lambda: ctranslate2_decoder(ct2_dir, "float32", threads),
            "ctranslate2 int8": lambda: ctranslate2_decoder(ct2_dir, "int8", threads),
            "transformers float32": lambda: transformers_decoder(hf_dir, threads),
        }
        rows = []
        for name, make in systems.items():
            if name in skip:
                continue
            decode = make()
            batch_rate, texts = timed(decode, lines, 128)
            bleu = metric.corpus_score(texts, [refs]).score
            single_rate, _ = timed(decode, lines[: args.single], 1)
            rows.append((name, batch_rate, single_rate, bleu))
            print(
                f"{name}: batch 128 {batch_rate:.1f} sent/s, batch 1 {single_rate:.1f} sent/s, "
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
