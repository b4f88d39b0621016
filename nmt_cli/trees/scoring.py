"""Scoring parses line by line: what `nmt score --trees` and `nmt run` report for parsing.

The references are gold trees, one a line, as EVALB takes them (a data directory of the
`ptb` presets keeps them as the raw target text of dev and test). The hypotheses are
either bracketed trees, one a line, from any parser, or, when the source words are
given, a model's linearized output (`(S (NP XX XX )NP ... )S`), turned back into trees by
re-inserting the words (`linearize.delinearize`). Either way a hypothesis that is not a
well-formed tree is repaired by the stated rules (`tree.read_trees`,
`linearize.delinearize`) and counted, never an error: the count and the rules that
applied are part of the result. A reference that is not a well-formed tree is an error:
the gold file is wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from nmt_cli.errors import NmtError
from nmt_cli.trees.evalb import COLLINS, EvalbParams, EvalbResult, EvalbSummary, evalb
from nmt_cli.trees.linearize import delinearize
from nmt_cli.trees.tree import Tree, read_tree


@dataclass(frozen=True)
class TreeScore:
    """EVALB's two summaries, and how many hypotheses had to be repaired (and how)."""

    lines: int
    all: EvalbSummary
    short: EvalbSummary  # sentences of at most `cutoff_len` words
    cutoff_len: int
    repaired: int  # hypotheses that needed at least one repair
    repairs: dict[str, int]  # hypotheses each rule applied to
    signature: str
    trees: list[str] = field(repr=False)  # the hypotheses as scored, one bracketed line each

    @property
    def f1(self) -> float:
        return self.all.f1


def signature(linearized: bool, params: EvalbParams = COLLINS) -> str:
    """What the figures mean, printed beside them as sacreBLEU prints its signature."""
    prm = "COLLINS.prm" if params == COLLINS else "custom"
    hyp = "linearized+words" if linearized else "bracketed"
    return f"evalb:{prm}|cutoff:{params.cutoff_len}|hyp:{hyp}|xx-tags:gold|repair:stated"


def read_gold(lines: Sequence[str], name: str) -> list[Tree]:
    """Gold trees, one a line; any line that is not exactly one well-formed tree is an
    error naming the file and the line."""
    trees = []
    for n, line in enumerate(lines, start=1):
        tree, repairs = read_tree(line)
        if tree is None or repairs:
            what = ", ".join(repairs) if repairs else "no tree"
            raise NmtError(f"{name}:{n}: not a well-formed gold tree ({what})")
        trees.append(tree)
    return trees


def score_trees(
    hyps: Sequence[str],
    refs: Sequence[str],
    words: Sequence[str] | None = None,
    names: Sequence[str] = ("hypotheses", "reference", "source"),
    params: EvalbParams = COLLINS,
) -> TreeScore:
    """Score hypotheses against gold trees (line-aligned); with `words` (the source
    sentences, line-aligned too), the hypotheses are linearized outputs to delinearize."""
    for other, name in ((refs, names[1]), (words, names[2])):
        if other is not None and len(other) != len(hyps):
            raise NmtError(
                f"{names[0]} has {len(hyps):,} lines but {name} has {len(other):,}: "
                "hypotheses and references must be line-aligned"
            )
    if not refs:
        raise NmtError(f"{names[1]}: the reference is empty")
    gold = read_gold(refs, names[1])
    tests: list[Tree | None] = []
    repairs: Counter[str] = Counter()
    repaired = 0
    for n, hyp in enumerate(hyps):
        if words is not None:
            made = delinearize(hyp, words[n].split())
            tree: Tree | None = made.tree
            applied = made.repairs
        else:
            tree, applied = read_tree(hyp)
        tests.append(tree)
        repairs.update(applied)
        repaired += bool(applied)
    result: EvalbResult = evalb(list(zip(gold, tests, strict=True)), params)
    return TreeScore(
        len(hyps), result.all, result.short, params.cutoff_len, repaired,
        dict(sorted(repairs.items())), signature(words is not None, params),
        [t.bracketed() if t else "" for t in tests],
    )  # fmt: skip
