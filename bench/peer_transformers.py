"""transformers (MarianMT `generate`) on an `nmt export --to huggingface` directory, timed
in a process of its own (peer_worker.py). transformers needs torch; nothing else runs here.

    python bench/peer_transformers.py HF_DIR lines.txt out.txt --batch 128 --threads 2

One batch at a time on all `threads` threads (transformers has no side-by-side batches),
the sentences sorted by length first (less padding), beam 4, its |Y| ** 0.6 length
penalty, at most 50 + the batch's longest source tokens out (nmt's |source| + 50 limit,
taken once a call as CTranslate2 does).
"""

from __future__ import annotations

from typing import Any

from peer_worker import Decode, Output, time_and_report, worker_parser


def main() -> None:
    parser = worker_parser("transformers' generate, timed in a process of its own.")
    args = parser.parse_args()

    def load() -> Decode:
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        torch.set_num_threads(args.threads)
        tokenizer = AutoTokenizer.from_pretrained(str(args.model))
        model = AutoModelForSeq2SeqLM.from_pretrained(str(args.model)).eval()
        pad = tokenizer.pad_token_id

        def decode(lines: list[str]) -> list[Output]:
            order = sorted(range(len(lines)), key=lambda i: -len(lines[i]))
            out: dict[int, Output] = {}
            for lo in range(0, len(order), args.batch):
                index = order[lo : lo + args.batch]
                inputs = tokenizer([lines[i] for i in index], return_tensors="pt", padding=True)
                limit = 50 + inputs["input_ids"].size(1) - 1  # the longest source, without </s>
                with torch.inference_mode():
                    ids = model.generate(
                        **inputs, num_beams=4, length_penalty=0.6, max_new_tokens=limit + 1
                    )
                texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
                # tokens written: not the decoder's start token, padding, or </s>
                lengths = ((ids != pad) & (ids != tokenizer.eos_token_id)).sum(1).tolist()
                for i, text, n in zip(index, texts, lengths, strict=True):
                    out[i] = Output(text, int(n))
            return [out[i] for i in range(len(lines))]

        return decode

    def settings() -> dict[str, Any]:
        import torch
        import transformers

        return {
            "library": f"transformers {transformers.__version__} (torch {torch.__version__})",
            "torch_threads": torch.get_num_threads(),
            "batch": args.batch,
        }

    time_and_report(args, load, settings)


if __name__ == "__main__":
    main()
