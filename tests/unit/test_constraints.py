"""Constrained search (core/constraints.py): the parse-tree constraint makes every output a
well-formed tree with a leaf per input word (an XX slot, or the word's own pieces), the
phrase constraint makes every output start with its prefix and contain its phrases, beam 1
stays greedy search, and a constraint that forbids nothing changes nothing."""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_search import ScriptedModel, Table
from torch import Tensor

from nmt_cli.core.search import Hypothesis, beam_search, greedy_search
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.engines.translate.forced import ForcedIds, PhraseState
from nmt_cli.errors import UsageError
from nmt_cli.trees.constraint import CLOSE, OPEN, SLOT, Leaves, TreeVocabulary
from nmt_cli.trees.linearize import delinearize

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
EOS, A, B, C, D = 3, 4, 5, 6, 7
# A parsing model's target pieces: brackets that open and close, a slot, and what a tree
# never holds: words, a bracket that cannot close (PP), a bare closing bracket.
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "▁(S", "▁)S", "▁(NP", "▁)NP", "▁(VP", "▁)VP"]
PIECES += ["▁XX", "▁the", "▁dog", "▁(PP", "▁)", "s", "ed"]
TREES = TreeVocabulary.of_pieces(PIECES)
WORD_TREES = TreeVocabulary.of_pieces(PIECES, "words")
# What a word's leaf may be made of when the leaves are words: a word-start piece, then
# continuations (ids 11-12 start a word, 15-16 continue one).
STARTS, CONTINUATIONS = (11, 12), (15, 16)
SRC_VOCAB = 20


def slots(counts: list[int]) -> list[Leaves]:
    """XX leaves for sentences of `counts` words."""
    assert TREES is not None
    return [TREES.leaves(["w"] * n, lambda word: []) for n in counts]


@cache
def random_model(seed: int, tgt_vocab: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=16,
        d_ff=32,
        n_heads=2,
        dropout=0.0,
        src_vocab_size=SRC_VOCAB,
        tgt_vocab_size=tgt_vocab,
        joint_vocab=False,
        max_positions=64,
    )
    return Transformer(cfg).eval()


def sources(lengths: list[int], seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    src = torch.zeros(len(lengths), max(lengths) + 1, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, :length] = torch.randint(4, SRC_VOCAB, (length,), generator=gen)
        src[row, length] = EOS
    return src


def linearized(ids: list[int]) -> str:
    return " ".join(PIECES[i].removeprefix("▁") for i in ids)


def tokens(results: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in results]


def assert_trees(results: list[list[Hypothesis]], words: list[int]) -> None:
    assert TREES is not None
    for hyps, count in zip(results, words, strict=True):
        assert hyps
        for hyp in hyps:
            kinds = set(TREES.kind[hyp.tokens].tolist())
            assert kinds <= {OPEN, CLOSE, SLOT}, linearized(hyp.tokens)
            output = linearized(hyp.tokens)
            read = delinearize(output, [f"w{i}" for i in range(count)])
            assert read.repairs == (), (output, count, read.repairs)
            assert output.split().count("XX") == count
            assert read.tree.words() == [f"w{i}" for i in range(count)]


@SETTINGS
@given(
    case=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 9)), min_size=1, max_size=4),
    beam=st.integers(1, 5),
    nbest=st.integers(1, 5),
    max_len_a=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    max_len_b=st.integers(0, 8),
    alpha=st.sampled_from([0.0, 0.6, 1.5]),
    seed=st.integers(0, 3),
)
def test_every_constrained_output_is_a_tree_with_a_slot_per_word(
    case: list[tuple[int, int]],
    beam: int,
    nbest: int,
    max_len_a: float,
    max_len_b: int,
    alpha: float,
    seed: int,
) -> None:
    """The issue's property: random inputs, a random model, every search setting; length
    limits below what a tree needs are raised to it."""
    assert TREES is not None
    model = random_model(seed, len(PIECES))
    src = sources([length for length, _ in case], seed)
    words = [count for _, count in case]
    nbest = min(nbest, beam)
    limits = {"max_len_a": max_len_a, "max_len_b": max_len_b, "length_penalty": alpha}
    beamed = beam_search(
        model, src, beam_size=beam, nbest=nbest, constraint=TREES.start(slots(words)), **limits
    )
    greedy = greedy_search(model, src, constraint=TREES.start(slots(words)), **limits)
    assert_trees(beamed, words)
    assert_trees(greedy, words)
    one = beam_search(model, src, beam_size=1, constraint=TREES.start(slots(words)), **limits)
    assert tokens(one) == tokens(greedy)
    for a, b in zip(one, greedy, strict=True):
        assert a[0].score == pytest.approx(b[0].score, abs=1e-4)


def test_a_model_that_wants_to_end_writes_the_shortest_tree() -> None:
    """A model that would write EOS or words at once is held to a tree; with the length
    limit at 0 it is raised to exactly what the tree needs: open, one slot a word, close."""
    assert TREES is not None
    rest = {i: 0.001 for i in range(4, len(PIECES))}
    wants = {**rest, EOS: 0.9, PIECES.index("▁the"): 0.09, PIECES.index("▁(S"): 0.002}
    model = ScriptedModel({}, vocab=len(PIECES), default=wants)
    src = torch.tensor([[A, EOS], [A, EOS]])
    for search in (greedy_search, beam_search):
        tree = TREES.start(slots([2, 3]))
        results = search(model, src, max_len_a=0.0, max_len_b=0, constraint=tree)
        outputs = [linearized(hyps[0].tokens) for hyps in results]
        assert outputs == ["(S XX XX )S", "(S XX XX XX )S"]


def test_only_brackets_that_open_and_close_and_slots_are_tree_pieces() -> None:
    assert TREES is not None
    kinds = dict(zip(PIECES, TREES.kind.tolist(), strict=True))
    assert kinds["▁(NP"] == OPEN and kinds["▁)NP"] == CLOSE and kinds["▁XX"] == SLOT
    assert kinds["▁(PP"] not in (OPEN, CLOSE) and kinds["▁)"] not in (OPEN, CLOSE)
    assert kinds["▁the"] not in (OPEN, CLOSE, SLOT)
    assert TreeVocabulary.of_pieces(["<pad>", "<unk>", "<s>", "</s>", "▁the", "▁XX"]) is None
    assert TreeVocabulary.of_pieces(["<pad>", "<unk>", "<s>", "</s>", "▁(S", "▁)S"]) is None


WORD = st.tuples(st.sampled_from(STARTS), st.lists(st.sampled_from(CONTINUATIONS), max_size=2))
SENTENCE = st.lists(WORD.map(lambda w: (w[0], *w[1])), min_size=1, max_size=6).map(tuple)


@SETTINGS
@given(
    case=st.lists(st.tuples(st.integers(1, 6), SENTENCE), min_size=1, max_size=4),
    beam=st.integers(1, 5),
    nbest=st.integers(1, 5),
    max_len_a=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    max_len_b=st.integers(0, 8),
    seed=st.integers(0, 3),
)
def test_with_word_leaves_every_output_is_a_tree_that_writes_each_word_whole(
    case: list[tuple[int, Leaves]],
    beam: int,
    nbest: int,
    max_len_a: float,
    max_len_b: int,
    seed: int,
) -> None:
    """The same property where each leaf is its word's own pieces: every output is a
    well-formed tree whose leaves are exactly the sentence's words, in order, each written
    whole (no bracket between a word's pieces), and beam 1 is greedy search."""
    assert WORD_TREES is not None
    model = random_model(seed, len(PIECES))
    src = sources([length for length, _ in case], seed)
    leaves = [sentence for _, sentence in case]
    limits = {"max_len_a": max_len_a, "max_len_b": max_len_b}
    nbest = min(nbest, beam)
    beamed = beam_search(
        model, src, beam_size=beam, nbest=nbest, constraint=WORD_TREES.start(leaves), **limits
    )
    greedy = greedy_search(model, src, constraint=WORD_TREES.start(leaves), **limits)
    one = beam_search(model, src, beam_size=1, constraint=WORD_TREES.start(leaves), **limits)
    assert tokens(one) == tokens(greedy)
    for results in (beamed, greedy):
        for hyps, sentence in zip(results, leaves, strict=True):
            assert hyps
            names = [f"w{i}" for i in range(len(sentence))]
            for hyp in hyps:
                # The leaves in order, whole, between brackets; each written as its word.
                output = WORD_TREES.text(hyp.tokens, names, sentence)
                assert output is not None, (hyp.tokens, sentence)
                read = delinearize(output, names)
                assert read.repairs == (), (output, read.repairs)
                assert read.tree.words() == names


def test_word_leaves_are_the_words_own_pieces_and_brackets_cannot_be_words() -> None:
    assert TREES is not None and WORD_TREES is not None
    encode = {"the": [11], "dogs": [12, 15]}.__getitem__
    assert WORD_TREES.slot is None and TREES.slot == PIECES.index("▁XX")
    leaves = WORD_TREES.leaves(["the", "dogs"], encode)
    assert leaves == ((11,), (12, 15)) and TREES.leaves(["the", "dogs"], encode) == ((10,), (10,))
    tree = [4, 6, 11, 12, 15, 7, 5]  # (S (NP the dogs )NP )S, the pieces as words
    assert WORD_TREES.text(tree, ["the", "dogs"], leaves) == "(S (NP the dogs )NP )S"
    assert WORD_TREES.text([4, 6, 11, 12, 7, 5], ["the", "dogs"], leaves) is None  # half a word
    assert TREES.text(tree, ["the", "dogs"], leaves) is None  # XX leaves: the pieces' text
    # In a words-leaved vocabulary XX is an ordinary piece: it may be part of a word.
    assert int(WORD_TREES.kind[PIECES.index("▁XX")]) not in (OPEN, CLOSE, SLOT)
    for word, pieces in (("(NP", [6]), ("(x", [11]), (")", [14]), ("S", [5])):
        with pytest.raises(UsageError, match="bracket"):
            WORD_TREES.leaves([word], lambda w, p=pieces: p)


def contains(whole: list[int], part: tuple[int, ...]) -> bool:
    return any(tuple(whole[i : i + len(part)]) == part for i in range(len(whole)))


PIECE = st.integers(4, 11)
FORCED = st.builds(
    ForcedIds,
    prefix=st.lists(PIECE, max_size=3).map(tuple),
    phrases=st.lists(st.lists(PIECE, min_size=1, max_size=3).map(tuple), max_size=3).map(tuple),
)


@SETTINGS
@given(
    case=st.lists(st.tuples(st.integers(1, 6), FORCED), min_size=1, max_size=4),
    beam=st.integers(1, 6),
    nbest=st.integers(1, 3),
    max_len_a=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    max_len_b=st.integers(0, 6),
    seed=st.integers(0, 3),
)
def test_every_output_starts_with_its_prefix_and_holds_its_phrases(
    case: list[tuple[int, ForcedIds]],
    beam: int,
    nbest: int,
    max_len_a: float,
    max_len_b: int,
    seed: int,
) -> None:
    model = random_model(seed, 12)
    src = sources([length for length, _ in case], seed)
    forced = [f for _, f in case]
    nbest = min(nbest, beam)
    limits = {"max_len_a": max_len_a, "max_len_b": max_len_b}
    held = PhraseState(forced)
    beamed = beam_search(model, src, beam_size=beam, nbest=nbest, constraint=held, **limits)
    greedy = greedy_search(model, src, constraint=PhraseState(forced), **limits)
    one = beam_search(model, src, beam_size=1, constraint=PhraseState(forced), **limits)
    assert tokens(one) == tokens(greedy)
    for results in (beamed, greedy):
        for hyps, want in zip(results, forced, strict=True):
            assert hyps
            for hyp in hyps:
                assert tuple(hyp.tokens[: len(want.prefix)]) == want.prefix
                assert all(contains(hyp.tokens, phrase) for phrase in want.phrases), (hyp, want)


def test_a_constraint_that_forbids_nothing_changes_nothing() -> None:
    """Outputs and scores as without a constraint: the hook itself is transparent."""
    model = random_model(0, 12)
    src = sources([3, 5, 1, 4], 0)
    nothing = [ForcedIds()] * 4
    for beam in (1, 4):
        plain = beam_search(model, src, beam_size=beam, nbest=beam)
        held = beam_search(model, src, beam_size=beam, nbest=beam, constraint=PhraseState(nothing))
        assert tokens(held) == tokens(plain)
        assert [[h.score for h in hyps] for hyps in held] == [
            [h.score for h in hyps] for hyps in plain
        ]
    assert tokens(greedy_search(model, src, constraint=PhraseState(nothing))) == tokens(
        greedy_search(model, src)
    )


def test_a_length_limit_below_the_constraint_is_raised_to_it() -> None:
    model = random_model(1, 12)
    src = sources([2], 1)
    forced = [ForcedIds(prefix=(4, 5), phrases=((9, 8, 7),))]
    for search in (greedy_search, beam_search):
        [[hyp]] = search(model, src, max_len_a=0.0, max_len_b=0, constraint=PhraseState(forced))
        assert hyp.tokens == [4, 5, 9, 8, 7]


def test_a_phrase_inside_the_prefix_is_already_written() -> None:
    model = random_model(1, 12)
    src = sources([2], 1)
    forced = [ForcedIds(prefix=(4, 5, 6), phrases=((5, 6),))]
    [[hyp]] = greedy_search(model, src, max_len_a=0.0, max_len_b=0, constraint=PhraseState(forced))
    assert hyp.tokens == [4, 5, 6]


# The model would write "a b" or "a d"; "a c b" holds the phrase c in the middle, at a
# cost; every hypothesis that postpones c has a better score until it must write c.
PHRASE_TABLE: Table = {
    (): {A: 0.7, B: 0.2, C: 0.05, D: 0.05},
    (A,): {EOS: 0.6, B: 0.2, D: 0.15, C: 0.05},
    (A, B): {EOS: 0.9, D: 0.05, C: 0.025, B: 0.025},
    (A, D): {EOS: 0.9, B: 0.05, C: 0.025, D: 0.025},
    (A, C): {B: 0.9, EOS: 0.05, C: 0.025, D: 0.025},
    (A, C, B): {EOS: 0.97, A: 0.01, C: 0.01, D: 0.01},
}
ELSE = {EOS: 0.97, A: 0.01, B: 0.01, C: 0.004, D: 0.006}


def test_dynamic_beam_allocation_keeps_a_hypothesis_that_began_the_phrase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a bank for hypotheses that have written the phrase, beam 2 finds "a c b"; with
    the model choosing alone, both beams go to the better-scored "a b" and "a d" and the
    phrase comes last."""
    model = ScriptedModel(PHRASE_TABLE, vocab=8, default=ELSE)
    src = torch.tensor([[A, EOS]])
    forced = [ForcedIds(phrases=((C,),))]
    [[hyp]] = beam_search(model, src, beam_size=2, constraint=PhraseState(forced))
    assert hyp.tokens == [A, C, B]
    assert hyp.log_prob == pytest.approx(math.log(0.7 * 0.05 * 0.9 * 0.97))
    monkeypatch.setattr(PhraseState, "choose", lambda self, *args: None)
    [[alone]] = beam_search(model, src, beam_size=2, constraint=PhraseState(forced))
    assert alone.tokens[-1] == C and alone.log_prob < hyp.log_prob
