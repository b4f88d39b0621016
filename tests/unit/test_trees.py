"""Trees: the bracket reader and its repairs, Vinyals et al.'s linearization with its
normalisations, and the way back from a model's output (repairs named and counted)."""

from __future__ import annotations

import pytest

from nmt_cli.trees.linearize import (
    base_label,
    delinearize,
    evaluation_tree,
    linearize,
    normalize,
    source_words,
)
from nmt_cli.trees.scoring import score_trees
from nmt_cli.trees.tree import Tree, read_tree, read_trees

# A small treebank in the WSJ files' own layout: an unlabelled root per sentence, trees
# over several lines, traces, co-indices, function tags, unary chains, brackets that hold
# only traces, -LRB-/-RRB-, quotes, an ADVP|PRT label, and sentences whose root is TOP or
# holds two constituents.
HAND_TREEBANK = """
( (S
    (NP-SBJ (NNP John) )
    (VP (VBZ has)
      (NP (DT a) (NN dog) ))
    (. .) ))
( (S
    (NP-SBJ-1 (DT The) (NN company) )
    (VP (VBD said)
      (SBAR (-NONE- 0)
        (S
          (NP-SBJ (-NONE- *-1) )
          (VP (TO to)
            (VP (VB cut)
              (NP (NNS jobs) ))))))
    (. .) ))
( (S
    (S-TPC-2 (NP-SBJ (PRP It) ) (VP (VBZ works) ))
    (, ,)
    (NP-SBJ (PRP he) )
    (VP (VBD said) (SBAR (-NONE- 0) (S (-NONE- *T*-2) )))
    (. .) ))
( (NP (NP (NNP Bank) ) (-LRB- -LRB-) (NP (NNP U.S.) ) (-RRB- -RRB-) ))
(TOP (S (NP-SBJ (PRP They)) (VP (VBD gave) (ADVP|PRT (RP up))) (. .)))
( (S (`` ``) (NP-SBJ=2 (PRP We)) (VP (VBP win)) ('' '')) (: --) )
( (NP (NN Oops)) (. .) )
"""


def hand_trees() -> list[Tree]:
    parsed = read_trees(HAND_TREEBANK)
    assert parsed.repairs == ()
    return parsed.trees


def test_the_papers_example_linearizes_as_vinyals_et_al_with_xx_tags() -> None:
    john = hand_trees()[0]
    assert linearize(john) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"
    assert source_words(john) == ["John", "has", "a", "dog", "."]


def test_traces_function_tags_and_roots_are_normalised_away() -> None:
    trees = hand_trees()
    said = trees[1]
    assert source_words(said) == ["The", "company", "said", "to", "cut", "jobs", "."]
    assert linearize(said) == (
        "(S (NP XX XX )NP (VP XX (SBAR (S (VP XX (VP XX (NP XX )NP )VP )VP )S )SBAR )VP XX )S"
    )
    # a bracket over traces only goes entirely, a topicalized S keeps its label's stem
    assert linearize(trees[2]) == ("(S (S (NP XX )NP (VP XX )VP )S XX (NP XX )NP (VP XX )VP XX )S")
    assert linearize(trees[4]).startswith("(S (NP XX )NP (VP XX (ADVP|PRT XX )ADVP|PRT )VP")
    assert linearize(trees[5]) == "(S XX (NP XX )NP (VP XX )VP XX )S XX"  # two top brackets
    assert [base_label(x) for x in ("NP-SBJ-1", "PP=2", "S-TPC-2", "-NONE-", "ADVP|PRT")] == [
        "NP", "PP", "S", "-NONE-", "ADVP|PRT",
    ]  # fmt: skip
    kept = normalize(trees[3], pos_tags=True)[0]
    assert [tag for tag, _ in kept.preterminals()] == ["NNP", "-LRB-", "NNP", "-RRB-"]


def test_word_leaves_write_each_word_where_its_xx_stands() -> None:
    john, said = hand_trees()[:2]
    assert linearize(john, "words") == "(S (NP John )NP (VP has (NP a dog )NP )VP . )S"
    words = iter(source_words(said))
    xx = linearize(said).split()
    assert linearize(said, "words").split() == [t if t != "XX" else next(words) for t in xx]


@pytest.mark.parametrize("leaves", ["xx", "words"])
def test_every_hand_made_tree_comes_back_from_its_linearization(leaves: str) -> None:
    for original in hand_trees():
        made = delinearize(linearize(original, leaves), source_words(original))
        assert made.repairs == ()
        assert made.tree == Tree("TOP", tuple(normalize(original)))
        # and it scores 100 against the gold tree EVALB reads
        gold = evaluation_tree(original).bracketed()
        line = " ".join(source_words(original))
        score = score_trees([linearize(original, leaves)], [gold], [line])
        assert (score.f1, score.repaired, score.all.error_sentences) == (100.0, 0, 0)


def test_a_word_leaf_that_is_not_the_word_due_is_a_repair() -> None:
    made = delinearize("(S (NP John )NP (VP sings )VP )S", ["John", "has"])
    assert made.repairs == ("other-token",)
    assert made.tree.words() == ["John", "has"]  # the source's words, in order


def test_the_reader_round_trips_and_names_every_repair() -> None:
    for original in hand_trees():
        assert read_tree(original.bracketed()) == (original, ())
    cases = {
        "(S (NP (DT a)) ))": ("unmatched-close",),
        "(S (NP (DT a)": ("unclosed",),
        "(S (NP a b))": ("loose-word",),
        "(S (NP (DT a)) () (VP ))": ("empty",),
        "(NP (DT a)) (VP (VB b))": ("several-roots",),
    }
    for text, repairs in cases.items():
        parsed, named = read_tree(text)
        assert parsed is not None and named == repairs, text
    assert read_tree("(S (NP a b))")[0] == Tree(
        "S", (Tree("NP", (Tree("XX", ("a",)), Tree("XX", ("b",)))),)
    )
    assert read_tree("(NP (DT a)) (VP (VB b))")[0] == Tree(
        "TOP", (Tree("NP", (Tree("DT", ("a",)),)), Tree("VP", (Tree("VB", ("b",)),)))
    )
    assert read_tree("") == (None, ())
    assert read_tree("  ) (") == (None, ("empty", "unclosed", "unmatched-close"))


def xx(word: str) -> Tree:
    return Tree("XX", (word,))


@pytest.mark.parametrize(
    ("output", "words", "tree", "repairs"),
    [
        ("(S (NP XX )NP )S )S (VP XX )VP", "a b", "(TOP (S (NP (XX a))) (VP (XX b)))",
         ("unmatched-close",)),
        ("(S ( XX )S", "a", "(TOP (S (XX a)))", ("bare-open",)),
        ("(S XX the )S", "a b", "(TOP (S (XX a) (XX b)))", ("other-token",)),
        ("(S XX XX XX )S", "a b", "(TOP (S (XX a) (XX b)))", ("extra-slots",)),
        ("(S (NP XX )NP )S", "a b c", "(TOP (S (NP (XX a)) (XX b) (XX c)))", ("missing-words",)),
        ("(S XX )S XX", "a b c", "(TOP (S (XX a)) (XX b) (XX c))", ("missing-words",)),
        ("(S (NP XX (VP XX", "a b", "(TOP (S (NP (XX a) (VP (XX b)))))", ("unclosed",)),
        ("(S (NP )NP XX (X (Y )Y )X )S", "a", "(TOP (S (XX a)))", ("empty-bracket",)),
        ("", "a b", "(TOP (XX a) (XX b))", ("missing-words",)),
        (")NP )S", "", "(TOP)", ("empty-bracket", "unmatched-close")),
    ],
)  # fmt: skip
def test_an_ill_formed_output_is_repaired_by_the_stated_rules(
    output: str, words: str, tree: str, repairs: tuple[str, ...]
) -> None:
    made = delinearize(output, words.split())
    assert made.tree.bracketed() == tree
    assert made.repairs == repairs
    assert made.tree.words() == words.split()  # the sentence's words, in order, always


def test_repaired_outputs_are_counted_by_rule_never_an_error() -> None:
    gold = [evaluation_tree(t).bracketed() for t in hand_trees()[:3]]
    words = [" ".join(source_words(t)) for t in hand_trees()[:3]]
    outputs = [
        linearize(hand_trees()[0]),
        "(S (NP XX XX )NP (VP XX",  # cut short: unclosed, missing words
        ")S garbage (",  # nothing usable
    ]
    score = score_trees(outputs, gold, words)
    assert score.repaired == 2 and score.lines == 3
    assert score.repairs == {
        "bare-open": 1, "missing-words": 2, "other-token": 1, "unclosed": 1,
        "unmatched-close": 1,
    }  # fmt: skip
    assert score.all.error_sentences == 0 and score.all.valid_sentences == 3
    assert 0 < score.f1 < 100
    assert [read_tree(t)[0] is not None for t in score.trees] == [True, True, True]


def test_deep_nesting_needs_no_recursion() -> None:
    depth = 1500  # Python's recursion limit is 1,000 frames
    output = "(S " * depth + "XX" + " )S" * depth
    made = delinearize(output, ["a"])
    assert made.repairs == ()
    text = made.tree.bracketed()
    again = read_tree(text)[0]
    assert again is not None and again.bracketed() == text  # (== on trees itself recurses)
    assert linearize(made.tree) == output
    assert evalb_f1_of_itself(made.tree) == 100.0


def evalb_f1_of_itself(tree: Tree) -> float:
    return score_trees([tree.bracketed()], [tree.bracketed()]).f1
