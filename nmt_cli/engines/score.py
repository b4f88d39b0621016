"""`nmt score`: sacreBLEU, chrF and TER with their signatures, and the paper's tokenized BLEU.

The paper's BLEU is not sacreBLEU: tensor2tensor's `get_ende_bleu.sh` Moses-tokenizes
hypotheses and references, splits hyphenated compounds ("a-b" -> "a ##AT##-##AT## b") and
runs multi-bleu on the result, which scores about one point above sacreBLEU's detokenized
BLEU on newstest2014. Both are reported, each with a label and a signature, so nobody
compares the two by mistake.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any, Literal

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from nmt_cli.errors import NmtError, UsageError
from nmt_cli.optional import require

PAPER_LABEL = (
    "tokenized BLEU as in the paper (Moses tokenizer + compound splitting, multi-bleu "
    "style); NOT comparable with sacreBLEU"
)
_COMPOUND = re.compile(r"(\S)-(\S)")
# What does without sacremoses, in `nmt score` and in a recipe (`nmt run`, `nmt sweep`).
PAPER_AVOID = (
    "score with sacreBLEU only: nmt score --no-paper, or score.paper_bleu = false in a "
    "recipe (nmt run --set score.paper_bleu=false)"
)


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


def check_settings(settings: ScoreSettings) -> None:
    """Option values, refused before any scoring (exit code 2, naming the flag)."""
    if settings.bootstrap < 0:
        raise UsageError(
            f"--bootstrap must be 0 (none) or a number of resamples, got {settings.bootstrap}"
        )
    if settings.bootstrap == 1:
        raise UsageError("--bootstrap 1 gives no interval; use at least 2 resamples (e.g. 1000)")
    if settings.samples < 0:
        raise UsageError(
            f"the paired test needs a positive number of samples, got {settings.samples}"
        )
    if settings.paper:
        require_sacremoses()  # uncached, unlike the two below
    if settings.paper and settings.lang not in moses_languages():
        known = ", ".join(sorted(moses_languages()))
        raise UsageError(
            f"--lang {settings.lang!r}: not a language the Moses tokenizer knows ({known})"
        )


def require_sacremoses(module: str = "sacremoses") -> ModuleType:
    """sacremoses (or one of its modules), which only the paper's BLEU needs."""
    return require(module, purpose="the paper's tokenized BLEU", avoid=PAPER_AVOID)


@lru_cache(maxsize=1)
def moses_languages() -> frozenset[str]:
    """Language codes sacremoses has rules for (non-breaking prefixes, or its CJK modes)."""
    prefixes = require_sacremoses("sacremoses.corpus").NonbreakingPrefixes()
    return frozenset(prefixes.available_langs.values()) | {"ja", "ko"}


def mostly_empty(lines: Sequence[str], share: float = 0.5) -> int:
    """The number of empty lines when they are more than `share` of `lines`, else 0: a
    system that outputs mostly nothing (an undertrained model) scores near 0 without any
    error, and deserves a warning rather than a quiet number in a table."""
    empty = sum(1 for line in lines if not line.strip())
    return empty if lines and empty > share * len(lines) else 0


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


def _resamples_as_floats(metric: Metric) -> None:
    """sacreBLEU (2.6) scores each bootstrap resample from float32 statistics: chrF and TER
    give a numpy float32, or a plain 0.0 for a resample with nothing to count (an empty
    line drawn alone), and the mean of that mix raises TypeError in `statistics.mean`. On
    this metric instance every score is a plain float, as a user's `--bootstrap` needs."""
    compute = metric._compute_score_from_stats

    def as_float(stats: Any) -> Any:
        score = compute(stats)
        score.score = float(score.score)
        return score

    metric._compute_score_from_stats = as_float  # type: ignore[method-assign]


@lru_cache(maxsize=4)
def _moses(lang: str) -> Any:
    return require_sacremoses().MosesTokenizer(lang=lang)


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
    if n > 1:
        _resamples_as_floats(metric)
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
    on_metric: Callable[[str], None] = lambda name: None,
) -> ScoreResult:
    """Score hypotheses against one or more reference sets (each line-aligned with them).

    `other`, if given, is a second system compared with `hyps` by a paired test.
    `names` label the hypotheses and references in error messages. `on_metric(name)` is
    called as each metric is done (bootstrap resampling makes each one slow).
    """
    settings = settings or ScoreSettings()
    check_settings(settings)
    names = names or ["hypotheses", *(f"reference {i + 1}" for i in range(len(refs)))]
    check_inputs(hyps, refs, names)
    if other is not None and len(other) != len(hyps):
        raise NmtError(
            f"{names[0]} has {len(hyps):,} lines but the compared system has {len(other):,}"
        )
    ref_sets = [list(r) for r in refs]
    n = settings.bootstrap
    metrics = []
    for metric, name in ((BLEU(), "BLEU"), (CHRF(), "chrF2"), (TER(), "TER")):
        metrics.append(_score(metric, name, hyps, ref_sets, n))
        on_metric(name)
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
        on_metric(paper.name)
    comparisons = _compare(hyps, other, ref_sets, settings) if other is not None else []
    if other is not None:
        on_metric("paired test")
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
