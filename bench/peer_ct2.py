"""CTranslate2 as the peer of `nmt translate` in the decoding benchmarks.

The model is exported with nmt's own exporter (`nmt export --to ctranslate2`, float32
and int8) and decoded with nmt's decoding settings: beam 4, alpha 0.6, at most
a * |source| + b output tokens (|source| without </s>, the limit without </s>), outputs
allowed to be empty. Two differences cannot be removed and are printed by the scripts:
CTranslate2 divides a hypothesis' log-probability by |Y| ** alpha, not by nmt's GNMT
((5 + |Y|) / 6) ** alpha, and it takes one length limit per call, so every batch gets the
limit of its longest sentence (exact at batch 1). The sentences are sorted by length and
cut into batches exactly as nmt's Translator does, so both decode the same batches.

Run as a script, it is the CTranslate2 worker of the benchmarks (peer_worker.py): one
process that imports CTranslate2 and SentencePiece, never torch; `one_line_at_a_time`
runs it for the latency of a line typed at a time.

    python bench/peer_ct2.py CT2_DIR lines.txt out.txt --batch 128 --threads 1 \\
        --compute-type float32
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from peer_launch import Layout, run_worker, worker_command
from peer_worker import Decode, Output, time_and_report, worker_parser

from nmt_cli.config import DecodeConfig

DECODE = DecodeConfig()  # nmt's defaults: the settings both systems get


def export_command(
    model: Path, out_dir: Path, quantization: str = "float32", to: str = "ctranslate2"
) -> list[str]:
    """`nmt export` as a user runs it (the same Python as this benchmark); `quantization`
    is CTranslate2's only."""
    command = [sys.executable, "-m", "nmt_cli", "export", "--to", to, "-q"]
    if to == "ctranslate2":
        command += ["--quantization", quantization]
    return [*command, str(model), str(out_dir)]


def export(
    model: Path, out_dir: Path, quantization: str = "float32", to: str = "ctranslate2"
) -> str:
    """Export `model` into `out_dir` in a process of its own; returns the command, for
    the record."""
    command = export_command(model, out_dir, quantization, to)
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


def one_line_at_a_time(
    model_dir: Path, compute_type: str, lines: list[str]
) -> tuple[list[float], str]:
    """CTranslate2 translating `lines` one at a time (batch 1, one thread), in a process
    of its own pinned to the first usable core, after one line as a warm-up: each line's
    seconds, and the command that measured them."""
    with tempfile.TemporaryDirectory() as tmp:
        path, output = Path(tmp) / "lines.txt", Path(tmp) / "out.txt"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        command = worker_command(
            "peer_ct2.py", model_dir, path, output, batch=1, threads=1, warmup=1,
            compute_type=compute_type, one_at_a_time=True,
        )  # fmt: skip
        done = run_worker(command, output, Layout.first(1))
    return done.report["line_seconds"], done.command


def main() -> None:
    parser = worker_parser("CTranslate2 decoding, timed in a process of its own.")
    parser.add_argument("--compute-type", default="float32", help="float32, int8, ...")
    args = parser.parse_args()

    def load() -> Decode:
        decoder = Ct2Decoder(args.model, args.compute_type, args.threads)
        return lambda lines: decoder.translate(lines, args.batch)

    def settings() -> dict[str, Any]:
        import ctranslate2

        return {
            "library": f"ctranslate2 {ctranslate2.__version__}",
            "compute_type": args.compute_type,
            "inter_threads": args.threads,
            "intra_threads": 1,
            "batch": args.batch,
        }

    time_and_report(args, load, settings)


if __name__ == "__main__":
    main()
