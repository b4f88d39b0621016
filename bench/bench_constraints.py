"""What constrained search costs: decoding with no constraint before and after the hook,
and with the parse-tree and phrase constraints against none.

One random model of the `ptb-sample-parsing` recipe's shape (2+2 layers, d_model 128,
a 4,000-piece target vocabulary whose pieces include the tree's brackets and slot), on
the CPU backend as `nmt translate` decodes it (compiled step, fp32), one thread, decodes
the same random batch of sentences, rounds interleaved (the host's drift hits both
alike), median CPU seconds of the rounds:

1. no constraint: this tree's search against `--baseline`'s (its core/search.py loaded
   from git), the same outputs required; the times are directly comparable;
2. the tree constraint (XX leaves, and word leaves of one or two pieces a word), and
   prefix + phrase constraints (dynamic beam allocation),
   against none: a random model writes outputs of other lengths under a constraint, so
   these compare the time per decoder step (rows of hypotheses each step, summed).

    .venv/bin/python bench/bench_constraints.py --baseline e294835
    .venv/bin/python bench/bench_constraints.py --baseline e294835 --beam 21 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.core import search
from nmt_cli.core.beam_advance import decode_then_advance
from nmt_cli.core.checkpoint import build_transformer
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.cpu_level import cpu_level
from nmt_cli.engines.models import decoding_models
from nmt_cli.engines.translate.forced import ForcedIds, PhraseState
from nmt_cli.trees.constraint import TreeVocabulary

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["S", "NP", "VP", "PP", "SBAR", "ADJP", "ADVP", "QP", "WHNP", "PRN", "SINV", "FRAG"]


def pieces(size: int) -> list[str]:
    """A target vocabulary as a parsing model's: specials, brackets, the slot, words."""
    tree = [f"\u2581{side}{label}" for label in LABELS for side in "()"] + ["\u2581XX"]
    words = [f"\u2581w{i}" for i in range(size - 4 - len(tree))]
    return ["<pad>", "<unk>", "<s>", "</s>", *tree, *words]


def baseline_search(revision: str) -> Any:
    """core/search.py as it was at `revision`, loaded as a module of its own."""
    text = subprocess.run(
        ["git", "show", f"{revision}:nmt_cli/core/search.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_search.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_search", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Counted:
    """The model, counting the rows of every decoder step (both sides of a comparison
    pay the same for it)."""

    def __init__(self, model: Any) -> None:
        self.model, self.rows = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @property
    def max_positions(self) -> int:
        return int(self.model.max_positions)

    def decode_step(self, last: Tensor, *args: Any, **kwargs: Any) -> Any:
        self.rows += last.numel()
        return self.model.decode_step(last, *args, **kwargs)

    decode_advance = decode_then_advance  # through the counting decode_step


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of this process (one thread): on a shared machine, less of the other
    processes' load than wall time."""
    start = time.process_time()
    out = run()
    return time.process_time() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="revision before the hook")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=4000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target = pieces(args.vocab)
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=2, d_model=128, d_ff=512, n_heads=4, dropout=0.0,
        src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, max_positions=1024,
    )  # fmt: skip
    weights = Transformer(cfg).state_dict()
    cpu = torch.device("cpu")
    [model], _ = decoding_models([partial(build_transformer, cfg, weights)], cpu, "fp32", True)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 40, (args.sentences,), generator=gen).tolist()
    src = torch.zeros(args.sentences, max(lengths) + 1, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, :length] = torch.randint(4, args.vocab, (length,), generator=gen)
        src[row, length] = 3
    words = [max(1, round(n * 0.8)) for n in lengths]  # words: fewer than pieces
    trees = TreeVocabulary.of_pieces(target)
    word_trees = TreeVocabulary.of_pieces(target, "words")
    assert trees is not None and word_trees is not None
    slots = [trees.leaves(["w"] * n, lambda w: []) for n in words]
    # Word leaves: each word one or two of the vocabulary's word pieces, as BPE cuts words.
    first_word = target.index("\u2581w0")
    spelled = [
        tuple(tuple(torch.randint(first_word, args.vocab, (1 + int(k % 3 == 0),),
                                  generator=gen).tolist()) for k in range(n))
        for n in words
    ]  # fmt: skip
    forced = [ForcedIds(prefix=(100, 101), phrases=((200, 201), (300,))) for _ in lengths]
    # A random model rarely ends: a short limit keeps every run at its length limit.
    limits = {"max_len_a": 1.0, "max_len_b": 10, "length_penalty": 0.6}
    before = baseline_search(args.baseline)

    def beam(module: Any, counted: Counted, constraint: Any = None) -> Any:
        extra = {"constraint": constraint} if constraint is not None else {}
        return module.beam_search(counted, src, beam_size=args.beam, **limits, **extra)

    cases: dict[str, Callable[[Counted], Any]] = {
        "baseline, no constraint": lambda m: beam(before, m),
        "this tree, no constraint": lambda m: beam(search, m),
        "tree constraint (XX)": lambda m: beam(search, m, trees.start(slots)),
        "tree constraint (words)": lambda m: beam(search, m, word_trees.start(spelled)),
        "prefix + 2 phrases": lambda m: beam(search, m, PhraseState(forced)),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    rows: dict[str, int] = {}
    outputs: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, case in cases.items():
            counted = Counted(model)
            took, out = timed(lambda case=case, counted=counted: case(counted))
            seconds[name].append(took)
            rows[name], outputs[name] = counted.rows, out
    same = [[h.tokens for h in hyps] for hyps in outputs["baseline, no constraint"]] == [
        [h.tokens for h in hyps] for hyps in outputs["this tree, no constraint"]
    ]
    print(
        f"CPU level {cpu_level()}, 1 thread, beam {args.beam}, {args.sentences} sentences, "
        f"vocabulary {args.vocab}, {args.rounds} rounds; baseline {args.baseline}; "
        f"no-constraint outputs identical: {same}"
    )
    plain = statistics.median(seconds["this tree, no constraint"])
    plain_step = plain / rows["this tree, no constraint"] * 1e6
    print(f"{'search':28} {'CPU s':>9} {'row-steps':>10} {'us/row-step':>12} {'vs none':>8}")
    for name in cases:
        median = statistics.median(seconds[name])
        per_row = median / rows[name] * 1e6
        print(
            f"{name:28} {median:9.3f} {rows[name]:10,} {per_row:12.1f} {per_row / plain_step:8.3f}"
        )
    if not same:
        sys.exit("the baseline's outputs differ from this tree's")


if __name__ == "__main__":
    main()
