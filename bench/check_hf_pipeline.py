"""`pipeline("translation")` on an `nmt export --to huggingface` directory, against nmt.

transformers 5 has no translation pipeline, and transformers 4 cannot be installed beside
nmt's pinned `datasets`, so this check runs in a separate environment that has only
torch, sentencepiece and transformers 4:

    nmt export --to huggingface runs/multi30k-en-de/average.pt hf-export/
    nmt translate -m runs/multi30k-en-de/average.pt --precision fp32 --beam 1 \\
        -i test.en -o test.nmt
    python -m venv tf4 && tf4/bin/pip install torch sentencepiece 'transformers<5'
    tf4/bin/python bench/check_hf_pipeline.py hf-export/ test.en test.nmt

Greedy decoding on both sides (the two beam searches differ in their length penalties),
so the pipeline's translations must equal nmt's line for line. Prints how many do and
every line that does not; exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("source", type=Path, help="source lines")
    parser.add_argument("nmt_output", type=Path, help="nmt translate --beam 1 of the source")
    args = parser.parse_args()

    import transformers
    from transformers import pipeline

    translate = pipeline("translation", model=str(args.export_dir))
    lines = args.source.read_text(encoding="utf-8").splitlines()
    expected = args.nmt_output.read_text(encoding="utf-8").splitlines()
    got = [out["translation_text"] for out in translate(lines, num_beams=1, batch_size=16)]
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    print(f"transformers {transformers.__version__}: {same} of {len(expected)} lines as nmt's")
    for line, (a, b) in enumerate(zip(got, expected, strict=True), 1):
        if a != b:
            print(f"line {line}: pipeline {a!r} | nmt {b!r}")
    return 0 if same == len(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
