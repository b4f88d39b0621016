"""Beam and greedy search: scripted beams computed by hand, invariants on a random model,
and exact decoding by a tiny model trained here to reverse sequences."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from reverser import reverse_batch
from torch import Tensor

from nmt_cli.backends.cpu.decoder import batch_bucket
from nmt_cli.core.beam_advance import decode_then_advance, torch_advance
from nmt_cli.core.open_sentence import search_loop_only
from nmt_cli.core.search import (
    Hypothesis,
    beam_search,
    greedy_search,
    length_penalty_value,
    max_output_lengths,
)
from nmt_cli.core.transformer import Transformer

EOS, A, B = 3, 4, 5


pytestmark = pytest.mark.usefixtures("one_thread")


Table = dict[tuple[int, ...], dict[int, float]]


class ScriptedCache:
    """Remembers each row's prefix; reorder follows the search's index like a real cache."""

    def __init__(self) -> None:
        self.prefixes: list[tuple[int, ...]] | None = None

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        assert self.prefixes is not None
        self.prefixes = [self.prefixes[i] for i in index.tolist()]

    def reserve(self, steps: int) -> None:
        pass


class ScriptedModel:
    """Next-token probabilities are a function of the prefix alone (like fairseq's
    test_sequence_generator stub, but keyed on the prefix so beam order cannot matter).
    A prefix missing from the table ends with certainty."""

    max_positions = None
    advance = staticmethod(torch_advance)
    decode_advance = decode_then_advance
    finish_sentence = search_loop_only

    def __init__(
        self,
        table: Table,
        vocab: int = 6,
        default: dict[int, float] | None = None,
        slots: Callable[[int], int] = int,
    ):
        self.table, self.vocab = table, vocab
        self.default = default or {EOS: 1.0}
        self.slot_rule = slots

    def slots(self, open_sentences: int, beam: int) -> int:
        return self.slot_rule(open_sentences)

    def source_mask(self, src: Tensor) -> Tensor:
        return (src != 0)[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return torch.zeros(src.size(0), src.size(1), 1)

    def new_cache(self) -> ScriptedCache:
        return ScriptedCache()

    def decode_step(
        self, last: Tensor, memory: Tensor, src_mask: Tensor, cache: ScriptedCache
    ) -> tuple[Tensor, None]:
        if cache.prefixes is None:
            cache.prefixes = [() for _ in range(last.numel())]
        else:
            cache.prefixes = [(*p, t) for p, t in zip(cache.prefixes, last.tolist(), strict=True)]
        out = torch.full((last.numel(), self.vocab), -math.inf)
        for row, prefix in enumerate(cache.prefixes):
            for tok, p in self.table.get(prefix, self.default).items():
                out[row, tok] = math.log(p)
        return out, None


# () -> a .6 | b .4; (b) ends with .9; (a) continues with a or b.
TABLE: Table = {
    (): {A: 0.6, B: 0.4},
    (A,): {A: 0.4, B: 0.35, EOS: 0.25},
    (B,): {EOS: 0.9, A: 0.05, B: 0.05},
    (A, A): {EOS: 1.0},
    (A, B): {EOS: 0.5, A: 0.5},
}
SRC = torch.tensor([[A, EOS]])


def tokens(hyps: list[Hypothesis]) -> list[list[int]]:
    return [h.tokens for h in hyps]


def test_scripted_greedy_follows_the_argmax() -> None:
    # a (.6), then a (.4), then EOS (1.0): p = .24 although "b EOS" has .36.
    [hyp] = greedy_search(ScriptedModel(TABLE), SRC)[0]
    assert hyp.tokens == [A, A]
    assert hyp.log_prob == pytest.approx(math.log(0.24))
    assert hyp.score == pytest.approx(math.log(0.24) / ((5 + 3) / 6) ** 0.6)


def test_scripted_beam_two_finds_the_better_short_hypothesis() -> None:
    # Step 1 candidates: b.EOS .36, a.a .24, a.b .21, a.EOS .15 -> b.EOS finished, a.a open.
    # alpha 0: the open beam (.24) cannot beat .36 any more, so search stops.
    [hyp] = beam_search(ScriptedModel(TABLE), SRC, beam_size=2, length_penalty=0.0)[0]
    assert hyp.tokens == [B]
    assert hyp.log_prob == pytest.approx(math.log(0.36))
    assert hyp.score == pytest.approx(math.log(0.36))


def test_scripted_nbest_lists_the_finished_hypotheses_best_first() -> None:
    hyps = beam_search(ScriptedModel(TABLE), SRC, beam_size=2, length_penalty=0.0, nbest=2)[0]
    assert tokens(hyps) == [[B], [A, A]]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.36), math.log(0.24)])


def test_scripted_beam_three_keeps_the_three_best_candidates() -> None:
    # Step 1 top 3: b.EOS .36 (set aside), a.a .24, a.b .21. Step 2: a.a.EOS .24,
    # a.b.EOS .105, a.b.a .105 -> three finished: [b] .36, [a a] .24, [a b] .105.
    hyps = beam_search(ScriptedModel(TABLE), SRC, beam_size=3, length_penalty=0.0, nbest=3)[0]
    assert tokens(hyps) == [[B], [A, A], [A, B]]
    assert [h.log_prob for h in hyps] == pytest.approx(
        [math.log(0.36), math.log(0.24), math.log(0.105)]
    )


# The length penalty lets a long, certain continuation win (alpha 2). Step 1 keeps
# b.EOS (.45, set aside, score ln(.45) / (7/6)^2 = -0.5867) and a.a (.2, open). Ending at
# the next step, a.a could only reach ln(.2) / (8/6)^2 = -0.905: a search that bounded open
# beams by the next step's penalty would stop and return [b]. The right bound uses the
# largest reachable penalty, and a.a.a.a.a.EOS indeed scores ln(.2) / (11/6)^2 = -0.4789.
LONG: Table = {
    (): {A: 0.5, B: 0.5},
    (B,): {EOS: 0.9, A: 0.1},
    (A,): {A: 0.4, B: 0.3, EOS: 0.3},
    (A, A): {A: 1.0},
    (A, A, A): {A: 1.0},
    (A, A, A, A): {A: 1.0},
}


def test_stopping_bound_uses_the_largest_reachable_length_penalty() -> None:
    hyps = beam_search(ScriptedModel(LONG), SRC, beam_size=2, length_penalty=2.0, nbest=2)[0]
    assert tokens(hyps) == [[A, A, A, A, A], [B]]
    assert [h.score for h in hyps] == pytest.approx(
        [math.log(0.2) / (11 / 6) ** 2, math.log(0.45) / (7 / 6) ** 2]
    )
    # With one hypothesis asked for, [b] alone is finished after step 1: only the bound
    # keeps the search going (with two asked for, the second's -inf does too).
    [best] = beam_search(ScriptedModel(LONG), SRC, beam_size=2, length_penalty=2.0)[0]
    assert best.tokens == [A, A, A, A, A]
    # Without the penalty the short hypothesis wins and search stops at once.
    [short] = beam_search(ScriptedModel(LONG), SRC, beam_size=2, length_penalty=0.0)[0]
    assert short.tokens == [B]


def test_maximum_length_forces_the_end(batch: Tensor) -> None:
    limits = max_output_lengths(batch, 1.0, 2, None).tolist()
    assert limits == [6, 8, 3, 5]  # |source| + 2, the source's EOS not counted
    babbler = ScriptedModel({}, vocab=30, default={A: 0.9, EOS: 0.1})  # prefers to go on
    for search in (beam_search, greedy_search):
        results = search(babbler, batch, max_len_b=2)
        assert [h[0].tokens for h in results] == [[A] * n for n in limits]
    assert max_output_lengths(torch.tensor([[4, 5, 6, 3, 0]]), 1.0, 50, 1024).tolist() == [53]
    assert max_output_lengths(torch.tensor([[4, 5, 6, 3, 0]]), 1.0, 50, 20).tolist() == [19]


def test_finished_sentences_leave_the_batch_in_few_shapes() -> None:
    assert [batch_bucket(n) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert batch_bucket(121) == 128 and batch_bucket(128) == 128


def test_sentences_ending_at_different_steps_each_get_their_own_hypotheses() -> None:
    # Sentences whose length limits differ finish at different steps (limits 1, 2, 3, 6:
    # |source| + b with b = 0); the batch keeps finished ones as filler (3 open -> 4 slots)
    # and each sentence still gets exactly its own hypotheses.
    babbler = ScriptedModel({}, vocab=30, default={A: 0.9, EOS: 0.1}, slots=batch_bucket)
    src = torch.tensor([[A, EOS, 0, 0, 0, 0, 0], [A, A, EOS, 0, 0, 0, 0],
                        [A, A, A, EOS, 0, 0, 0], [B] * 6 + [EOS]])  # fmt: skip
    # alpha 1: each token costs ln .9 but raises the penalty, so the longest ending wins.
    results = beam_search(babbler, src, beam_size=2, length_penalty=1.0, max_len_b=0)
    assert [tokens(h) for h in results] == [[[A]], [[A, A]], [[A] * 3], [[A] * 6]]


class RowCounter(ScriptedModel):
    """Records the rows of every step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[int] = []

    def decode_step(
        self, last: Tensor, memory: Tensor, src_mask: Tensor, cache: ScriptedCache
    ) -> tuple[Tensor, None]:
        self.rows.append(last.numel())
        return super().decode_step(last, memory, src_mask, cache)


def test_finished_sentences_can_leave_the_batch_at_once() -> None:
    """With exact slots (`Searchable.slots`, where no product builds a kernel per shape)
    a batch keeps exactly its open sentences: its rows shrink as each one ends, and
    every sentence gets the hypotheses it gets with the buckets' filler."""
    src = torch.tensor([[A, EOS, 0, 0, 0, 0, 0], [A, A, EOS, 0, 0, 0, 0],
                        [A, A, A, EOS, 0, 0, 0], [B] * 6 + [EOS]])  # fmt: skip
    found = {}
    for name, bucket in (("buckets", batch_bucket), ("exact", int)):
        babbler = RowCounter({}, vocab=30, default={A: 0.9, EOS: 0.1}, slots=bucket)
        results = beam_search(babbler, src, 2, 1.0, max_len_b=0, nbest=2)
        found[name] = ([tokens(h) for h in results], babbler.rows)
    assert found["exact"][0] == found["buckets"][0]
    # Step 0 has one row a sentence, then 2 beams each; limits 1, 2, 3, 6 end them in turn.
    assert found["exact"][1] == [4, 8, 6, 4, 2, 2, 2]
    assert found["buckets"][1] == [4, 8, 8, 4, 2, 2, 2]  # 3 open sentences in 4 slots


def test_a_sentence_allowed_no_tokens_ends_at_once_beside_longer_ones() -> None:
    """A limit of 0 (an empty source, b = 0) forces EOS at the very first step, even where
    the model wants another token and its neighbour may still write two."""
    babbler = ScriptedModel({}, vocab=30, default={A: 0.9, EOS: 0.1})
    src = torch.tensor([[A, A, EOS], [EOS, 0, 0]])
    results = beam_search(babbler, src, beam_size=2, length_penalty=1.0, max_len_b=0)
    assert [tokens(h) for h in results] == [[[A, A]], [[]]]


def test_nbest_larger_than_beam_is_refused() -> None:
    with pytest.raises(ValueError, match="nbest"):
        beam_search(ScriptedModel(TABLE), SRC, beam_size=2, nbest=3)


# ---- a random model: invariants ----


@pytest.fixture
def batch() -> Tensor:
    return torch.tensor(
        [
            [5, 6, 7, 8, 3, 0, 0],
            [9, 10, 11, 12, 13, 14, 3],
            [4, 3, 0, 0, 0, 0, 0],
            [20, 21, 22, 3, 0, 0, 0],
        ]
    )


def _sentences(batch: Tensor) -> list[Tensor]:
    return [row[: int((row != 0).sum())][None] for row in batch]


def test_beam_one_equals_greedy(tiny_model: Transformer, batch: Tensor) -> None:
    greedy = greedy_search(tiny_model, batch, max_len_b=12)
    beam1 = beam_search(tiny_model, batch, beam_size=1, max_len_b=12)
    assert [tokens(h) for h in beam1] == [tokens(h) for h in greedy]
    for g, b in zip(greedy, beam1, strict=True):
        assert b[0].score == pytest.approx(g[0].score, abs=1e-4)


def test_batched_equals_one_by_one(tiny_model: Transformer, batch: Tensor) -> None:
    batched = beam_search(tiny_model, batch, beam_size=4, max_len_b=12, nbest=3)
    for sent, hyps in zip(_sentences(batch), batched, strict=True):
        [alone] = beam_search(tiny_model, sent, beam_size=4, max_len_b=12, nbest=3)
        assert tokens(alone) == tokens(hyps)
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], abs=1e-4)
    greedy_batched = greedy_search(tiny_model, batch, max_len_b=12)
    for sent, hyps in zip(_sentences(batch), greedy_batched, strict=True):
        assert tokens(greedy_search(tiny_model, sent, max_len_b=12)[0]) == tokens(hyps)


def teacher_forced_log_prob(model: Transformer, src: Tensor, ids: list[int]) -> float:
    tgt_in = torch.tensor([[2, *ids]])
    tgt_out = torch.tensor([[*ids, EOS]])
    with torch.no_grad():
        lprobs = F.log_softmax(model(src, tgt_in).float(), dim=-1)
    return float(lprobs.gather(-1, tgt_out[..., None]).sum())


def test_scores_equal_teacher_forced_log_probability(
    tiny_model: Transformer, batch: Tensor
) -> None:
    alpha = 0.6
    results = beam_search(tiny_model, batch, beam_size=3, max_len_b=8, nbest=3)
    checked = 0
    for sent, hyps in zip(_sentences(batch), results, strict=True):
        for hyp in hyps:
            expected = teacher_forced_log_prob(tiny_model, sent, hyp.tokens)
            assert hyp.log_prob == pytest.approx(expected, abs=1e-4)
            lp = length_penalty_value(len(hyp.tokens) + 1, alpha)
            assert hyp.score == pytest.approx(expected / lp, abs=1e-4)
            checked += 1
    assert checked == 12


# ---- a tiny model trained to reverse sequences is decoded exactly ----


def test_trained_reverser_is_decoded_exactly(reverser: Transformer) -> None:
    src, _, tgt_out = reverse_batch(100, torch.Generator().manual_seed(123))
    expected = [[t for t in row.tolist() if t > EOS] for row in tgt_out]
    beam = beam_search(reverser, src, beam_size=4)
    greedy = greedy_search(reverser, src)
    assert [h[0].tokens for h in beam] == expected
    assert [h[0].tokens for h in greedy] == expected
