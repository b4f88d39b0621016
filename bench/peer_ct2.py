"""CTranslate2 as the peer of `nmt translate` in the decoding benchmarks.

The model is exported with nmt's own exporter (`nmt export --to ctranslate2`, float32
and int8) and decoded with nmt's decoding settings: beam 4, alpha 0.6, at most
a * |source| + b output tokens (|source| without </s>, the limit without </s>), outputs
allowed to be empty. Two differences cannot be removed and are printed by the scripts:
CTranslate2 divides a hypothesis' log-probability by |Y| ** alpha, not by nmt's GNMT
((5 + |Y|) / 6) ** alpha, and it takes one length limit per call, so every batch gets the
limit of its longest sentence (exact at batch 1). The sentences are sorted by length and
cut into batches exactly as nmt's Translator does, so both decode the same batches.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.config import DecodeConfig

DECODE = DecodeConfig()  # nmt's defaults: the settings both systems get


@dataclass(frozen=True)
class Output:
    text: str
    tokens: int  # target subword tokens of the best hypothesis, without </s>


def export_command(model: Path, out_dir: Path, quantization: str) -> list[str]:
    """`nmt export` as a user runs it (the same Python as this benchmark)."""
    command = [sys.executable, "-m", "nmt_cli", "export", "--to", "ctranslate2"]
    return [*command, "--quantization", quantization, "-q", str(model), str(out_dir)]


def export(model: Path, out_dir: Path, quantization: str) -> str:
    """Export `model` into `out_dir`; returns the command, for the record."""
    command = export_command(model, out_dir, quantization)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"nmt export failed: {done.stderr.strip()}")
    return " ".join(command)


def length_sorted_batches(lengths: list[int], batch: int) -> list[list[int]]:
    """Indices of the non-empty sentences, longest first, in runs of `batch`: the batches
    nmt's Translator cuts from one chunk (engines/translate/translator.py, `_batches`)."""
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i])
    return [order[lo : lo + batch] for lo in range(0, len(order), batch)]


class Ct2Decoder:
    """One CTranslate2 translator and its SentencePiece models.

    `inter_threads` batches run side by side, one thread each (intra_threads=1), the
    layout `nmt translate` uses on a CPU; batches are submitted asynchronously, so they
    really do run in parallel.
    """

    def __init__(self, model_dir: Path, compute_type: str, inter_threads: int) -> None:
        import ctranslate2
        import sentencepiece as spm

        self.source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
        self.translator: Any = ctranslate2.Translator(
            str(model_dir),
            device="cpu",
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=1,
        )

    def _options(self, pieces: list[list[str]]) -> dict[str, Any]:
        longest = max(len(p) for p in pieces)
        return {
            "beam_size": DECODE.beam_size,
            "length_penalty": DECODE.length_penalty,
            "max_decoding_length": int(DECODE.max_len_a * longest + DECODE.max_len_b),
            "min_decoding_length": 0,
            "max_batch_size": 0,  # the batch is already cut as nmt cuts it
        }

    def translate(self, lines: list[str], batch: int) -> list[Output]:
        """Best translations of `lines` in their order, `batch` sentences a call."""
        pieces: list[list[str]] = self.source.encode(lines, out_type=str)
        out = [Output("", 0) for _ in lines]
        pending = [
            (
                index,
                self.translator.translate_batch(
                    [pieces[i] for i in index],
                    asynchronous=True,
                    **self._options([pieces[i] for i in index]),
                ),
            )
            for index in length_sorted_batches([len(p) for p in pieces], batch)
        ]
        for index, results in pending:
            for i, result in zip(index, results, strict=True):
                best = result.result().hypotheses[0]
                out[i] = Output(self.target.decode(best), len(best))
        return out
