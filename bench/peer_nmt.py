"""nmt's Translator (the Python API) as one of the systems the decoding benchmarks compare,
timed in a process of its own like its peers (peer_worker.py).

    python bench/peer_nmt.py MODEL.pt lines.txt out.txt --batch 128 --threads 1 \\
        --precision int8

The Translator is loaded as `nmt translate` loads it, with `threads` CPU threads spent on
`threads` batches side by side (one thread each; worker processes past the first, started
by the warm-up) and `batch` sentences a batch; the timing is `Translator.translate` on
the lines: SentencePiece encoding, length-sorting into batches, beam search, detokenizing.
"""

from __future__ import annotations

from typing import Any

from peer_worker import Decode, Output, time_and_report, worker_parser


def main() -> None:
    parser = worker_parser("nmt's Translator, timed in a process of its own.")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16, int8, ...")
    args = parser.parse_args()
    loaded: dict[str, Any] = {}

    def load() -> Decode:
        from nmt_cli import Translator

        translator = Translator.load(
            args.model,
            precision=args.precision,
            batch_sentences=args.batch,
            threads=args.threads,
            workers=args.threads,
            device="cpu",
        )
        loaded["translator"] = translator

        def decode(lines: list[str]) -> list[Output]:
            return [
                Output(r.text, r.hypotheses[0].length if r.hypotheses else 0)
                for r in translator.translate(lines)
            ]

        return decode

    def settings() -> dict[str, Any]:
        import torch

        from nmt_cli.core.checkpoint import load_checkpoint

        translator = loaded["translator"]
        ckpt = load_checkpoint(args.model)
        cfg = ckpt.model_config
        return {
            "library": f"nmt (torch {torch.__version__})",
            "precision": translator.precision,
            "workers": translator.workers,
            "torch_threads": torch.get_num_threads(),
            "batch": translator.batch_sentences,
            "model": f"step {ckpt.step}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
            f"d_model {cfg.d_model}",
        }

    time_and_report(args, load, settings)


if __name__ == "__main__":
    main()
