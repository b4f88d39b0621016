"""Cleaning rules: each one applied as Moses clean-corpus-n does, and each one counted."""

from __future__ import annotations

import pytest

from nmt_cli.engines.prepare.cleaning import CleanRules, PairCleaner


def run(rules: CleanRules, pairs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], dict]:
    cleaner = PairCleaner(rules, "en", "de")
    kept = [k for k in (cleaner.clean(a, b) for a, b in pairs) if k is not None]
    return kept, cleaner.stats.as_dict()


def test_empty_and_whitespace_only_pairs_are_dropped() -> None:
    kept, stats = run(CleanRules(), [("a b", "c d"), ("", "x"), ("x", "   "), (" \t", "")])
    assert kept == [("a b", "c d")]
    assert stats["dropped"]["empty"] == 3
    assert stats["read"] == 4 and stats["kept"] == 1


def test_too_long_counts_whitespace_tokens_per_side() -> None:
    ok = " ".join(["w"] * 5)
    long = " ".join(["w"] * 6)
    kept, stats = run(CleanRules(max_len=5, max_len_ratio=0), [(ok, ok), (long, ok), (ok, long)])
    assert kept == [(ok, ok)]
    assert stats["dropped"]["too_long"] == 2


def test_length_ratio_in_both_directions_and_at_the_limit() -> None:
    two, three, four = "a b", "a b c", "a b c d"
    pairs = [(two, three), (three, two), (two, four), (four, two)]
    kept, stats = run(CleanRules(max_len_ratio=1.5), pairs)
    assert kept == [(two, three), (three, two)]  # 3/2 = 1.5 is allowed; 4/2 is not
    assert stats["dropped"]["ratio"] == 2


def test_zero_disables_length_and_ratio_limits() -> None:
    pairs = [("a", " ".join(["b"] * 400))]
    kept, _ = run(CleanRules(max_len=0, max_len_ratio=0), pairs)
    assert kept == pairs


def test_dedup_drops_exact_repeats_of_the_pair_only_when_asked() -> None:
    pairs = [("a b", "c d"), ("a b", "c d"), ("a b", "c e"), (" a b ", "c d")]
    kept, stats = run(CleanRules(dedup=True), pairs)
    assert kept == [("a b", "c d"), ("a b", "c e")]
    assert stats["dropped"]["duplicate"] == 2
    kept, stats = run(CleanRules(dedup=False), pairs)
    assert len(kept) == 4 and stats["dropped"]["duplicate"] == 0


def test_each_pair_is_charged_to_its_first_broken_rule() -> None:
    long = " ".join(["w"] * 300)
    _, stats = run(CleanRules(dedup=True), [("", long), (long, "x"), ("x", "y z w")])
    assert stats["dropped"] == {"empty": 1, "too_long": 1, "ratio": 1, "duplicate": 0}
    assert sum(stats["dropped"].values()) + stats["kept"] == stats["read"]


def test_punctuation_normalization_with_sacremoses() -> None:
    kept, _ = run(CleanRules(normalize_punctuation=True), [("„Hello“ world …", "«Hallo» Welt")])
    assert kept == [('"Hello" world ...', '"Hallo" Welt')]
    kept, _ = run(CleanRules(), [("„Hello“ world", "«Hallo» Welt")])
    assert kept == [("„Hello“ world", "«Hallo» Welt")]


def test_rules_validate_their_limits() -> None:
    with pytest.raises(ValueError, match="max_len_ratio"):
        CleanRules(max_len_ratio=0.5)
