"""Where a decoder step's time goes: PyTorch's profiler over `nmt translate`'s search.

    python bench/profile_decode.py DIR/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/average.pt --precision bf16 --batch 1

Translates the first --lines sentences one batch at a time (beam 4, one thread), as
`nmt translate --batch-size N` does, and prints per decoder step: how many times each
operator ran, its own time, and the share of the step, plus the wall time per step
and what the profiler does not see (Python between the operators); the compiled
module's kernels are listed under their own names (`nmt::...`). At batch 1 it also
prints the steps beam search took per output token; at larger batches, the beams the
search stepped against the fewest any beam-4 search could (4 a sentence for each of its
output tokens and its EOS), and how many of them were closed (whose rows the compiled
step skips). Operator times are inflated by the profiler itself and by other load on
the machine; the counts are exact.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.translate.loading import set_threads
from nmt_cli.engines.translate.translator import Translator
from nmt_cli.text_io import read_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="text to translate (.gz or plain)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--precision", default="bf16", help="fp32, bf16 or int8")
    parser.add_argument("--batch", type=int, default=1, help="sentences a batch")
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--top", type=int, default=25, help="operators listed")
    args = parser.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    set_threads(1, 1)
    lines = read_lines(args.source)[: args.lines]
    cfg = DecodeConfig(beam_size=4, precision=args.precision, batch_sentences=args.batch)
    translator = Translator.from_checkpoint(load_checkpoint(args.model), cfg, 1)
    translator.translate_chunk(lines[:8])  # warm-up: kernels, allocator

    # Decoder steps, counted at the model: no operator runs exactly once a step. Beam
    # search takes its first step through decode_step and the others through
    # decode_advance, which may call decode_step in turn (counted once).
    steps = rows = closed = 0
    within = False
    model = translator.model
    step, whole_step = model.decode_step, model.decode_advance

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps, rows
        if not within:
            steps += 1
            rows += args[0].numel()
        return step(*args, **kwargs)

    def counted_whole(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps, within, rows, closed
        steps += 1
        tokens, cum = args[0], args[4]  # a slot whose score is -inf is closed
        rows += tokens.numel()
        closed += int(cum.isneginf().sum())
        within = True
        try:
            return whole_step(*args, **kwargs)
        finally:
            within = False

    model.decode_step = counted  # type: ignore[method-assign]
    model.decode_advance = counted_whole  # type: ignore[method-assign]
    start = time.perf_counter()
    results = translator.translate_chunk(lines)
    wall = time.perf_counter() - start
    # Output tokens with their EOS: the fewest steps any search could take for them.
    produced = sum(r.hypotheses[0].length + 1 for r in results if r.hypotheses)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        translator.translate_chunk(lines)
    events = prof.key_averages()
    steps //= 2  # the same sentences were decoded twice
    rows //= 2
    closed //= 2
    seen_us = sum(e.self_cpu_time_total for e in events)
    # Where the compiled step runs a sentence's whole search in one call (batch 1), the
    # model sees no step: the figures are per sentence, the compiled kernels' operators
    # still listed under their names.
    unit, units = ("step", steps) if steps else ("sentence", len(lines))
    print(
        f"{len(lines)} sentences, {args.precision}, batch {args.batch}, beam 4, 1 thread: "
        f"{steps} steps seen, {wall / units * 1e3:.3f} ms a {unit} unprofiled "
        f"({len(lines) / wall:.1f} sentences/s)"
    )
    if args.batch == 1 and steps:  # at batch 1 every step belongs to the one sentence
        print(
            f"{steps / produced:.2f} steps per output token (EOS included): the exact "
            "stopping bound's extra steps"
        )
    elif steps:
        print(
            f"beams stepped: {rows} ({closed / rows:.1%} of them closed), "
            f"{rows / (4 * produced):.2f}x the {4 * produced} of 4 a sentence per output "
            f"token and EOS; open: {rows - closed} ({(rows - closed) / (4 * produced):.2f}x), "
            "the rest the exact stopping bound's extra steps (a batch's last sentence, "
            "handed to the compiled step, not seen)"
        )
    if not steps:
        print("each sentence's search ran in one compiled call: figures per sentence")
    print(f"operators seen by the profiler: {seen_us / units / 1e3:.3f} ms a {unit}")
    print(f"{'operator':<36}{'calls/' + unit:>13}{'us/' + unit:>12}{'share':>8}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        per_unit = e.self_cpu_time_total / units
        share = e.self_cpu_time_total / seen_us
        print(f"{e.key:<36}{e.count / units:>13.1f}{per_unit:>12.1f}{share:>8.1%}")
    calls = sum(e.count for e in events) / units
    print(f"all operators: {calls:.0f} calls a {unit}")


if __name__ == "__main__":
    main()
