"""`nmt score`: sacreBLEU, chrF and TER with their signatures, and the paper's tokenized BLEU.

The paper's BLEU is not sacreBLEU: tensor2tensor's `get_ende_bleu.sh` Moses-tokenizes
hypotheses and references, splits hyphenated compounds ("a-b" -> "a ##AT##-##AT## b") and
runs multi-bleu on the result, which scores about one point above sacreBLEU's detokenized
BLEU on newstest2014. Both are reported, each with a label and a signature, so nobody
compares the two by mistake.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from nmt_cli.errors import NmtError

PAPER_LABEL = (
    "tokenized BLEU as in the paper (Moses tokenizer + compound splitting, multi-bleu "
    "style); NOT comparable with sacreBLEU"
)
_COMPOUND = re.compile(r"(\S)-(\S)")


@dataclass(frozen=True)
class ScoreSettings:
    paper: bool = True  # also compute the paper's tokenized BLEU
    lang: str = "de"  # Moses tokenizer language for the paper's BLEU
    bootstrap: int = 0  # resamples for 95% confidence intervals; 0 = none
    test: Literal["bs", "ar"] = "bs"  # paired bootstrap or approximate randomization
    samples: int = 0  # resamples of the paired test; 0 = sacreBLEU's default


@dataclass(frozen=True)
class MetricScore:
    name: str  # "BLEU", "chrF2", "TER", "tokenized BLEU"
    score: float
    signature: str
    detail: str = ""  # BLEU's n-gram precisions and brevity penalty
    mean: float | None = None  # bootstrap mean
    ci: float | None = None  # bootstrap 95% confidence half-width


@dataclass(frozen=True)
class Comparison:
    """The paired test of a second system against the first (the baseline)."""

    metric: str
    baseline: float
    other: float
    p_value: float
    test: str  # "paired bootstrap" or "approximate randomization"


@dataclass(frozen=True)
class ScoreResult:
    lines: int
    references: int
    metrics: list[MetricScore]  # sacreBLEU BLEU, chrF, TER, then tokenized BLEU if asked
    comparisons: list[Comparison]

    def get(self, name: str) -> MetricScore:
        return next(m for m in self.metrics if m.name == name)

    @property
    def bleu(self) -> MetricScore:
        return self.get("BLEU")

    @property
    def paper_bleu(self) -> MetricScore | None:
        return next((m for m in self.metrics if m.name == "tokenized BLEU"), None)


def read_lines(path: Path) -> list[str]:
    """Lines of a text file without their line ends; a clear error for what cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file") from None
    except OSError as exc:
        raise NmtError(f"{path}: cannot be read ({exc.strerror})") from None
    return split_lines(data, str(path))


def split_lines(data: bytes, name: str) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise NmtError(f"{name}: line {line} is not valid UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def check_inputs(hyps: Sequence[str], refs: Sequence[Sequence[str]], names: Sequence[str]) -> None:
    """Every reference set non-empty and as long as the hypotheses, naming both counts."""
    if not refs:
        raise NmtError("at least one reference (--ref FILE) is needed")
    for name, ref in zip(names[1:], refs, strict=True):
        if not ref:
            raise NmtError(f"{name}: the reference is empty")
        if len(ref) != len(hyps):
            raise NmtError(
                f"{names[0]} has {len(hyps):,} lines but {name} has {len(ref):,}: "
                "hypotheses and references must be line-aligned"
            )


@lru_cache(maxsize=4)
def _moses(lang: str) -> Any:
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def paper_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses tokenization, then, for German, hyphenated compounds split as
    tensor2tensor's get_ende_bleu.sh does (`s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`); the
    paper's other language pair was scored on tokenized text without that step."""
    tok = _moses(lang)
    tokenized = [tok.tokenize(line, return_str=True, escape=True) for line in lines]
    if lang != "de":
        return tokenized
    return [_COMPOUND.sub(r"\1 ##AT##-##AT## \2", line) for line in tokenized]


def _score(metric: Metric, name: str, hyps: Sequence[str], refs: Any, n: int) -> MetricScore:
    result = metric.corpus_score(list(hyps), refs, n_bootstrap=max(n, 1))
    detail = ""
    if isinstance(metric, BLEU):
        detail = (
            f"{result.prec_str} (BP = {result.bp:.3f} ratio = {result.ratio:.3f} "
            f"hyp_len = {result.sys_len} ref_len = {result.ref_len})"
        )
    mean = getattr(result, "_mean", None)
    ci = getattr(result, "_ci", None)
    return MetricScore(
        name=name,
        score=float(result.score),
        signature=str(metric.get_signature()),
        detail=detail,
        mean=float(mean) if mean is not None and n > 1 else None,
        ci=float(ci) if ci is not None and n > 1 else None,
    )


def score_lines(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    settings: ScoreSettings | None = None,
    other: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> ScoreResult:
    """Score hypotheses against one or more reference sets (each line-aligned with them).

    `other`, if given, is a second system compared with `hyps` by a paired test.
    `names` label the hypotheses and references in error messages.
    """
    settings = settings or ScoreSettings()
    names = names or ["hypotheses", *(f"reference {i + 1}" for i in range(len(refs)))]
    check_inputs(hyps, refs, names)
    if other is not None and len(other) != len(hyps):
        raise NmtError(
            f"{names[0]} has {len(hyps):,} lines but the compared system has {len(other):,}"
        )
    ref_sets = [list(r) for r in refs]
    n = settings.bootstrap
    metrics = [
        _score(BLEU(), "BLEU", hyps, ref_sets, n),
        _score(CHRF(), "chrF2", hyps, ref_sets, n),
        _score(TER(), "TER", hyps, ref_sets, n),
    ]
    if settings.paper:
        tok_refs = [paper_tokenize(r, settings.lang) for r in ref_sets]
        paper = _score(
            BLEU(tokenize="none", force=True),
            "tokenized BLEU",
            paper_tokenize(hyps, settings.lang),
            tok_refs,
            n,
        )
        split = "+compound-split" if settings.lang == "de" else ""
        signature = f"tok:moses-{settings.lang}{split}|{paper.signature}"
        metrics.append(
            MetricScore(paper.name, paper.score, signature, paper.detail, paper.mean, paper.ci)
        )
    comparisons = _compare(hyps, other, ref_sets, settings) if other is not None else []
    return ScoreResult(len(hyps), len(refs), metrics, comparisons)


def _compare(
    hyps: Sequence[str], other: Sequence[str], refs: list[list[str]], settings: ScoreSettings
) -> list[Comparison]:
    """sacreBLEU's paired significance test (bootstrap resampling or approximate
    randomization) of `other` against `hyps` on BLEU and chrF."""
    samples = settings.samples or (1000 if settings.test == "bs" else 10000)
    test = PairedTest(
        [("baseline", list(hyps)), ("other", list(other))],
        {"BLEU": BLEU(), "chrF2": CHRF()},
        refs,
        test_type=settings.test,
        n_samples=samples,
    )
    _, scores = test()
    label = "paired bootstrap" if settings.test == "bs" else "approximate randomization"
    out = []
    for metric in ("BLEU", "chrF2"):
        base, alt = scores[metric]
        assert not isinstance(base, str) and not isinstance(alt, str)
        out.append(
            Comparison(metric, float(base.score), float(alt.score), float(alt.p_value or 0), label)
        )
    return out
