"""The figures of one `nmt run` directory: speed over the training time, BLEU at the end.

Reads `metrics.jsonl` (training records every log interval; the compile record when the
model was compiled) and `results.json` (written by `nmt run`'s score stage): the first
compiled update's time, the updates done, the median target tokens/s in the first 30 s,
the next 30 s and the rest (start-up, compilation and new shapes show in the first), and
each translated system's sacreBLEU and chrF2.

    python bench/run_figures.py runs/multi30k-en-de
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def figures(run: Path) -> list[str]:
    lines: list[str] = []
    metrics = run / "metrics.jsonl"
    records: list[dict[str, Any]] = []
    if metrics.is_file():
        records = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines() if x]
    for r in records:
        if r["type"] == "compile":
            lines.append(f"first update (compilation included): {r['first_update_s']:.1f} s")
    train = [r for r in records if r["type"] == "train"]
    if train:
        last = train[-1]
        lines.append(f"{last['step']:,} updates in {last['elapsed_s']:.0f} s of training")
        for lo, hi in ((0.0, 30.0), (30.0, 60.0), (60.0, float("inf"))):
            part = [r for r in train if lo <= r["elapsed_s"] < hi]
            if part:
                rate = statistics.median(r["tokens_per_s"] for r in part)
                end = min(hi, float(last["elapsed_s"]))
                lines.append(
                    f"  {lo:.0f}-{end:.0f} s: median {rate:,.0f} target tokens/s "
                    f"(logged at steps {part[0]['step']}-{part[-1]['step']})"
                )
    else:
        lines.append(f"no training records in {metrics}")
    results = run / "results.json"
    if results.is_file():
        for s in json.loads(results.read_text(encoding="utf-8")).get("systems", []):
            lines.append(f"{s['system']}: sacreBLEU {s['bleu']:.1f}, chrF2 {s['chrf']:.1f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    print("\n".join(figures(args.run_dir)))


if __name__ == "__main__":
    main()
