"""Training-pair cleaning: the rules of the usual WMT preparation, each one counted.

The rules follow Moses' `clean-corpus-n.perl` as fairseq's WMT14 scripts use it: a pair is
dropped when a side is empty, when a side has more than `max_len` whitespace tokens, or
when the longer side has more than `max_len_ratio` times the tokens of the shorter one.
Optional de-duplication drops exact repeats of a (source, target) pair, and optional
punctuation normalization runs sacremoses' port of Moses' `normalize-punctuation.perl`.
Each dropped pair is charged to the first rule it breaks, so the counts add up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

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
    from sacremoses import MosesPunctNormalizer

    normalizer = MosesPunctNormalizer(lang=lang)
    return normalizer.normalize


class PairCleaner:
    """Apply `CleanRules` to a stream of pairs; `clean` returns the pair to keep or None.

    De-duplication keeps a 16-byte fingerprint of every distinct pair: memory grows with
    the number of distinct pairs (about 100 bytes each), which is why it is off by default.
    """

    def __init__(self, rules: CleanRules, src_lang: str, tgt_lang: str) -> None:
        self.rules = rules
        self.stats = CleanStats()
        self._seen: set[bytes] = set()
        self._norm_src = make_normalizer(src_lang) if rules.normalize_punctuation else None
        self._norm_tgt = make_normalizer(tgt_lang) if rules.normalize_punctuation else None

    def normalize(self, src: str, tgt: str) -> tuple[str, str]:
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
