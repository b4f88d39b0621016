"""The clean stage: training pairs filtered by the usual WMT rules, each one counted.

The rules follow Moses' `clean-corpus-n.perl` as fairseq's WMT14 scripts use it: a pair is
dropped when a side is empty, when a side has more than `max_len` whitespace tokens, or
when the longer side has more than `max_len_ratio` times the tokens of the shorter one.
Optional de-duplication drops exact repeats of a (source, target) pair, and optional
punctuation normalization runs sacremoses' port of Moses' `normalize-punctuation.perl`.
Each dropped pair is charged to the first rule it breaks, so the counts add up. A corpus
may also say what a model learns of each target (`Corpus.target_form`: a treebank's
trees are linearized); the rules then see that form, and dev/test keep the original as
their raw text, the reference they are scored against.

The stage (`clean`) streams each split of the corpus once and writes the kept text to the
work folder, where the vocab and binarize stages read it. Dev and test sets are never
filtered: the paper's BLEU is on the whole official newstest sets (section 6.1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

from nmt_cli.core.files import atomic_path
from nmt_cli.engines.prepare.layout import SIDES, SPLITS, Layout
from nmt_cli.engines.prepare.progress import Progress, Step, step
from nmt_cli.engines.prepare.sources import Corpus
from nmt_cli.errors import NmtError
from nmt_cli.optional import require

RULES = ("empty", "too_long", "ratio", "duplicate")


@dataclass(frozen=True)
class CleanRules:
    max_len: int = 250  # whitespace tokens per side; 0 = no limit
    max_len_ratio: float = 1.5  # 0 = no limit
    dedup: bool = False
    normalize_punctuation: bool = False

    def __post_init__(self) -> None:
        if self.max_len < 0:
            raise ValueError(f"max_len must be >= 0, got {self.max_len}")
        if self.max_len_ratio and self.max_len_ratio < 1.0:
            raise ValueError(
                f"max_len_ratio must be >= 1 (or 0 for none), got {self.max_len_ratio}"
            )


@dataclass
class CleanStats:
    """How many pairs were read, kept, and dropped by each rule."""

    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))

    def as_dict(self) -> dict[str, object]:
        return {"read": self.read, "kept": self.kept, "dropped": dict(self.dropped)}


def make_normalizer(lang: str) -> Callable[[str], str]:
    """sacremoses punctuation normalization for one language (imported only when asked)."""
    sacremoses = require(
        "sacremoses",
        purpose="punctuation normalization",
        avoid="leave it off (no --normalize-punctuation; data.normalize_punctuation = false)",
    )
    normalizer = sacremoses.MosesPunctNormalizer(lang=lang)
    normalize: Callable[[str], str] = normalizer.normalize
    return normalize


class PairCleaner:
    """Apply `CleanRules` to a stream of pairs; `clean` returns the pair to keep or None.

    De-duplication keeps a 16-byte fingerprint of every distinct pair: memory grows with
    the number of distinct pairs (about 100 bytes each), which is why it is off by default.
    """

    def __init__(
        self,
        rules: CleanRules,
        src_lang: str,
        tgt_lang: str,
        target_form: Callable[[str], str] | None = None,
    ) -> None:
        self.rules = rules
        self._target_form = target_form  # e.g. a tree's linearization (Corpus.target_form)
        self.stats = CleanStats()
        self._seen: set[bytes] = set()
        self._norm_src = make_normalizer(src_lang) if rules.normalize_punctuation else None
        self._norm_tgt = make_normalizer(tgt_lang) if rules.normalize_punctuation else None

    def normalize(self, src: str, tgt: str) -> tuple[str, str]:
        if self._target_form is not None:
            tgt = self._target_form(tgt)
        if self._norm_src is not None and self._norm_tgt is not None:
            return self._norm_src(src).strip(), self._norm_tgt(tgt).strip()
        return src, tgt

    def clean(self, src: str, tgt: str) -> tuple[str, str] | None:
        self.stats.read += 1
        src, tgt = self.normalize(src.strip(), tgt.strip())
        rule = self._broken_rule(src, tgt)
        if rule is not None:
            self.stats.dropped[rule] += 1
            return None
        self.stats.kept += 1
        return src, tgt

    def _broken_rule(self, src: str, tgt: str) -> str | None:
        n_src, n_tgt = len(src.split()), len(tgt.split())
        if n_src == 0 or n_tgt == 0:
            return "empty"
        rules = self.rules
        if rules.max_len and (n_src > rules.max_len or n_tgt > rules.max_len):
            return "too_long"
        if rules.max_len_ratio and max(n_src, n_tgt) > rules.max_len_ratio * min(n_src, n_tgt):
            return "ratio"
        if rules.dedup:
            key = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=16).digest()
            if key in self._seen:
                return "duplicate"
            self._seen.add(key)
        return None


# --- the stage -----------------------------------------------------------------------------

ADVANCE_EVERY = 10_000  # training pairs between progress events


@dataclass(frozen=True)
class CleanInputs:
    """What the clean stage reads: the resolved corpus and how to filter its training set."""

    corpus: Corpus
    rules: CleanRules
    max_pairs: int = 0  # 0 = every training pair
    sample_max_pairs: bool = False  # a seeded sample of max_pairs instead of the first ones
    seed: int = 1


@dataclass(frozen=True)
class Cleaned:
    """What the clean stage made, as the state file keeps it and the manifest reports it."""

    src: str
    tgt: str
    source: dict[str, Any]  # the corpus's description
    character_coverage: float
    splits: dict[str, dict[str, Any]]  # split -> {"read", "kept", "dropped": {rule: n}}
    bad_utf8_replaced: int

    @property
    def pairs(self) -> int:
        """Pairs read, all splits together (the stage's count in `nmt prepare`'s summary)."""
        return sum(int(stats["read"]) for stats in self.splits.values())

    def kept(self, split: str) -> int:
        return int(self.splits[split]["kept"])

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Cleaned:
        return cls(**raw)


def clean(inputs: CleanInputs, layout: Layout, progress: Progress) -> Cleaned:
    """Clean every split of the corpus into the work folder; refuse an empty training set."""
    corpus = inputs.corpus
    splits: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        if split not in corpus.splits:
            continue
        source = corpus.splits[split]
        cleaner = PairCleaner(inputs.rules, corpus.src, corpus.tgt, corpus.target_form)
        pairs: Iterable[tuple[str, str]] = source.pairs()
        total = source.total
        if split == "train" and inputs.max_pairs:
            total = min(total, inputs.max_pairs) if total is not None else inputs.max_pairs
            pairs = (
                seeded_sample(pairs, inputs.max_pairs, inputs.seed)
                if inputs.sample_max_pairs
                else islice(pairs, inputs.max_pairs)
            )
        with step(progress, "clean", f"clean {split}", total) as work:
            if split == "train":
                splits[split] = _clean_train(pairs, cleaner, layout, work)
                _refuse_empty(splits[split])
            else:
                splits[split] = _keep_heldout(split, pairs, cleaner, layout, work)
    replaced = corpus.decoder.replaced if corpus.decoder else 0
    return Cleaned(corpus.src, corpus.tgt, corpus.info, corpus.character_coverage, splits, replaced)


def _clean_train(
    pairs: Iterable[tuple[str, str]], cleaner: PairCleaner, layout: Layout, work: Step
) -> dict[str, Any]:
    paths = [layout.cleaned("train", side) for side in SIDES]
    with _text_files(paths) as (fs, ft):
        for src, tgt in pairs:
            kept = cleaner.clean(src, tgt)
            if kept is not None:
                fs.write(kept[0] + "\n")
                ft.write(kept[1] + "\n")
            if cleaner.stats.read % ADVANCE_EVERY == 0:
                work.advance(ADVANCE_EVERY)
        work.advance(cleaner.stats.read % ADVANCE_EVERY)
    return cleaner.stats.as_dict()


def _refuse_empty(stats: dict[str, Any]) -> None:
    if stats["kept"] == 0:
        dropped = ", ".join(f"{k} {v:,}" for k, v in stats["dropped"].items() if v)
        raise NmtError(
            f"no training pairs left after cleaning (read {stats['read']:,}; "
            f"dropped: {dropped or 'none'}); check the input files or "
            "--max-len / --max-len-ratio"
        )


def _keep_heldout(
    split: str, pairs: Iterable[tuple[str, str]], cleaner: PairCleaner, layout: Layout, work: Step
) -> dict[str, Any]:
    """Dev and test sets are never filtered: BLEU must be on the whole official set.

    The raw text is kept for scoring; the text to encode is normalized like train's.
    """
    paths = [layout.raw_text(split, side) for side in SIDES]
    paths += [layout.cleaned(split, side) for side in SIDES]
    n = 0
    with _text_files(paths) as files:
        for src, tgt in pairs:
            src, tgt = src.strip(), tgt.strip()
            norm_src, norm_tgt = cleaner.normalize(src, tgt)
            for fh, text in zip(files, (src, tgt, norm_src, norm_tgt), strict=True):
                fh.write(text + "\n")
            n += 1
    work.advance(n)
    return {"read": n, "kept": n, "dropped": {}}


@contextmanager
def _text_files(paths: list[Path]) -> Iterator[list[TextIO]]:
    """UTF-8 files written atomically: on success all of them appear, on error none."""
    with ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(p)) for p in paths]
        yield [stack.enter_context(open(t, "w", encoding="utf-8", newline="\n")) for t in tmps]


def seeded_sample(pairs: Iterable[tuple[str, str]], k: int, seed: int) -> Iterator[tuple[str, str]]:
    """A uniform sample of k pairs in corpus order (reservoir sampling: one pass, k in memory)."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, tuple[str, str]]] = []
    for i, pair in enumerate(pairs):
        if i < k:
            reservoir.append((i, pair))
        else:
            j = rng.randrange(i + 1)
            if j < k:
                reservoir[j] = (i, pair)
    reservoir.sort(key=lambda item: item[0])
    return (pair for _, pair in reservoir)
