"""The EVALB scorer against evalb.c's own output: one hand-made sentence per COLLINS.prm
rule, with the figures `evalb -p COLLINS.prm` prints for exactly these trees."""

from __future__ import annotations

import pytest

from nmt_cli.trees.evalb import COLLINS, EvalbParams, SentenceScore, evalb, score_sentence
from nmt_cli.trees.linearize import delinearize
from nmt_cli.trees.tree import Tree, read_tree

DOG = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"


def tree(text: str) -> Tree:
    parsed, repairs = read_tree(text)
    assert parsed is not None and not repairs, text
    return parsed


def sentence(gold: str, test: str) -> SentenceScore:
    return score_sentence(tree(gold), tree(test) if test else None)


def counts(s: SentenceScore) -> tuple[int, int, int, int, int, int, int]:
    """evalb.c's per-sentence columns: Len, matched, gold, test, crossing, words, tags."""
    return (s.length, s.matched, s.gold_brackets, s.test_brackets, s.crossing, s.words,
            s.correct_tags)  # fmt: skip


def test_punctuation_is_deleted_from_each_tree_before_brackets_are_compared() -> None:
    """`, : `` '' .` go with their words: a comma inside the test NP changes no span."""
    s = sentence(
        "(TOP (S (NP (DT The) (NN dog)) (, ,) (VP (VBZ barks)) (. .)))",
        "(TOP (S (NP (DT The) (NN dog) (, ,)) (VP (VBZ barks) (. .))))",
    )
    assert counts(s) == (5, 3, 3, 3, 0, 3, 3)  # length counts punctuation, words do not
    # a test tree that leaves a period out altogether has the same words after deletion
    assert counts(sentence(DOG, "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks))))")) == (
        4, 3, 3, 3, 0, 3, 3,
    )  # fmt: skip


def test_advp_and_prt_are_one_label_and_top_is_not_counted() -> None:
    gold = "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))"
    assert counts(sentence(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up)))))")) == (
        3, 4, 4, 4, 0, 3, 2,
    )  # fmt: skip
    assert counts(sentence(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (NP (RB up)))))")) == (
        3, 3, 4, 4, 0, 3, 2,
    )  # fmt: skip
    assert COLLINS.same_label("PRT", "ADVP") and not COLLINS.same_label("PRT", "NP")


def test_unary_chains_match_as_many_times_as_both_trees_have_them() -> None:
    chain = "(TOP (S (NP (NP (DT the) (NN man))) (VP (VBD left))))"
    flat = "(TOP (S (NP (DT the) (NN man)) (VP (VBD left))))"
    assert counts(sentence(chain, flat)) == (3, 3, 4, 3, 0, 3, 3)  # recall 3/4
    # an extra unary S over the sentence, without TOP: precision 3/4
    assert counts(sentence(flat, "(S (S (NP (DT the) (NN man)) (VP (VBD left))))")) == (
        3, 3, 3, 4, 0, 3, 3,
    )  # fmt: skip


def test_traces_and_function_tags_are_removed_and_do_not_count_for_length() -> None:
    s = sentence(
        "(TOP (S (NP-SBJ-1 (NNP John)) (VP (VBD tried) (S (NP-SBJ (-NONE- *-1)) "
        "(VP (TO to) (VP (VB leave))))) (. .)))",
        "(TOP (S (NP (NNP John)) (VP (VBD tried) (S (VP (TO to) (VP (VB leave))))) (. .)))",
    )
    assert counts(s) == (5, 6, 6, 6, 0, 4, 4)


def test_crossing_brackets_are_counted_per_test_bracket() -> None:
    s = sentence(
        "(TOP (S (NP (NN a) (NN b)) (VP (VB c) (NN d))))",
        "(TOP (S (X (NN a)) (Y (NN b) (VB c)) (Z (NN d))))",
    )
    assert counts(s) == (4, 1, 3, 4, 1, 4, 4)


def test_a_crossing_counts_whichever_bracket_starts_first() -> None:
    """A test bracket crosses a gold one that starts inside it (X over "a b" against NP
    over "b c") as much as one it starts inside (the trees swapped)."""
    starts_before = "(TOP (S (X (NN a) (NN b)) (NN c)))"
    starts_inside = "(TOP (S (NN a) (NP (NN b) (NN c))))"
    assert counts(sentence(starts_inside, starts_before)) == (3, 1, 2, 2, 1, 3, 3)
    assert counts(sentence(starts_before, starts_inside)) == (3, 1, 2, 2, 1, 3, 3)


def test_labels_are_cut_at_an_equals_sign_as_at_a_hyphen() -> None:
    """evalb.c's `modify_label` ends a label at '=' (a gapping index) too."""
    gold = "(TOP (S (NP=2 (NN a)) (VP-TPC=1 (VB b))))"
    assert counts(sentence(gold, "(TOP (S (NP (NN a)) (VP (VB b))))")) == (2, 3, 3, 3, 0, 2, 2)


def test_the_summary_counts_sentences_with_two_crossings_or_fewer() -> None:
    """EVALB's "2 or less crossing" takes a sentence of exactly two; three is more."""
    gold = "(TOP (S (A (NN a) (NN b)) (B (NN c) (NN d)) (C (NN e) (NN f)) (D (NN g) (NN h))))"
    two = "(TOP (S (NN a) (X (NN b) (NN c)) (Y (NN d) (NN e)) (NN f) (NN g) (NN h)))"
    three = "(TOP (S (NN a) (X (NN b) (NN c)) (Y (NN d) (NN e)) (Z (NN f) (NN g)) (NN h)))"
    assert sentence(gold, two).crossing == 2 and sentence(gold, three).crossing == 3
    summary = evalb([(tree(gold), tree(two)), (tree(gold), tree(three))]).all
    assert (summary.no_crossing, summary.two_or_less_crossing) == (0.0, 50.0)
    assert summary.average_crossing == 2.5


def test_other_words_are_an_error_and_no_words_a_skip_both_left_out() -> None:
    wrong = sentence(DOG, "(TOP (S (NP (DT The) (NN cat)) (VP (VBZ barks)) (. .)))")
    assert wrong.status == "error" and wrong.error == "words unmatch (dog|cat)"
    shorter = sentence(DOG, "(TOP (S (NP (DT The)) (VP (VBZ barks))))")
    assert shorter.status == "error" and shorter.error == "length unmatch (3|2)"
    assert sentence(DOG, "").status == "skip"
    assert sentence(DOG, "(TOP (. .))").status == "skip"  # no word once punctuation goes


def _words(n: int) -> str:
    return " ".join(f"(NN w{i})" for i in range(1, n + 1))


def test_the_whole_file_as_evalb_summarises_it_with_the_length_cut_off() -> None:
    """evalb.c's summary of these twelve sentences: 85.29 / 82.86 / 84.06 over all,
    87.50 / 84.85 / 86.15 at <= 40 words (a 39-word sentence with a trace and a period is
    40 long; a 40-word one with a period is 41 and counts only in "all")."""
    pairs = [
        ("(TOP (S (NP (DT The) (NN dog)) (, ,) (VP (VBZ barks)) (. .)))",
         "(TOP (S (NP (DT The) (NN dog) (, ,)) (VP (VBZ barks) (. .))))"),
        ("(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))",
         "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up)))))"),
        ("(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))",
         "(TOP (S (NP (PRP He)) (VP (VBD gave) (NP (RB up)))))"),
        ("(TOP (S (NP (NP (DT the) (NN man))) (VP (VBD left))))",
         "(TOP (S (NP (DT the) (NN man)) (VP (VBD left))))"),
        ("(TOP (S (NP (DT the) (NN man)) (VP (VBD left))))",
         "(S (S (NP (DT the) (NN man)) (VP (VBD left))))"),
        ("(TOP (S (NP-SBJ-1 (NNP John)) (VP (VBD tried) (S (NP-SBJ (-NONE- *-1)) (VP (TO to) "
         "(VP (VB leave))))) (. .)))",
         "(TOP (S (NP (NNP John)) (VP (VBD tried) (S (VP (TO to) (VP (VB leave))))) (. .)))"),
        ("(TOP (S (NP (NN a) (NN b)) (VP (VB c) (NN d))))",
         "(TOP (S (X (NN a)) (Y (NN b) (VB c)) (Z (NN d))))"),
        (DOG, "(TOP (S (NP (DT The) (NN cat)) (VP (VBZ barks)) (. .)))"),
        (DOG, "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks))))"),
        (DOG, ""),
        (f"(TOP (S (NP {_words(39)}) (-NONE- *) (. .)))", f"(TOP (S (NP {_words(39)}) (. .)))"),
        (f"(TOP (S (NP {_words(40)}) (. .)))", f"(TOP (NP (NP {_words(40)}) (. .)))"),
    ]  # fmt: skip
    result = evalb([(tree(g), tree(t) if t else None) for g, t in pairs])
    every, short = result.all, result.short
    assert (every.sentences, every.error_sentences, every.skip_sentences) == (12, 1, 1)
    assert (every.matched_brackets, every.gold_brackets, every.test_brackets) == (29, 34, 35)
    figures = (every.recall, every.precision, every.f1, every.complete_match)
    assert [round(x, 2) for x in figures] == [85.29, 82.86, 84.06, 50.00]
    assert round(every.average_crossing, 2) == 0.10 and every.no_crossing == 90.0
    assert round(every.tagging_accuracy or 0, 2) == 98.10
    assert (short.sentences, short.valid_sentences) == (11, 9)
    figures = (short.recall, short.precision, short.f1, short.complete_match)
    assert [round(x, 2) for x in figures] == [87.50, 84.85, 86.15, 55.56]
    assert round(short.tagging_accuracy or 0, 2) == 96.92
    assert result.cutoff_len == 40


def test_xx_tags_borrow_the_gold_tags_so_punctuation_goes_and_tags_are_not_scored() -> None:
    """A model that predicts no POS tags (Vinyals et al.'s XX): its period is still deleted
    as the gold tree's is, and tagging accuracy is not a figure it has."""
    gold = tree("(TOP (S (NP (DT The) (NN dog)) (, ,) (VP (VBZ barks)) (. .)))")
    made = delinearize("(S (NP XX XX XX )NP (VP XX XX )VP )S", ["The", "dog", ",", "barks", "."])
    assert made.repairs == ()
    s = score_sentence(gold, made.tree)
    assert counts(s) == (5, 3, 3, 3, 0, 3, 0) and s.tagged == 0
    assert evalb([(gold, made.tree)]).all.tagging_accuracy is None


def test_unlabelled_scoring_and_another_cut_off() -> None:
    params = EvalbParams(cutoff_len=3, labeled=False)
    s = score_sentence(
        tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))"),
        tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (NP (RB up)))))"),
        params,
    )
    assert s.matched == 4
    with pytest.raises(ValueError):
        EvalbParams(cutoff_len=-1)
