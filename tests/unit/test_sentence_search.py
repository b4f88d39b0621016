"""A one-sentence search finished by the compiled step in one call (CpuDecoder's
finish_sentence, csrc/decoder_step.cpp) is search's own loop exactly: the same
hypotheses, scores and log-probabilities for every precision and CPU level, beam width,
n-best, length penalty and length limit, for sentences that end early and those that
reach their limit, alone or as the last one left of a batch; and search hands nothing
over where it records attention or where the cache would have to grow."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from decode_models import decode_model, wrap
from reverser import reverse_batch
from torch import Tensor

from nmt_cli.backends.cpu.decoder import CpuDecoder
from nmt_cli.backends.cpu.slot_cache import SlotCache
from nmt_cli.core.open_sentence import Ended, OpenSentence, search_loop_only
from nmt_cli.core.search import Hypothesis, beam_search
from nmt_cli.core.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")


class Handovers:
    """Counts the sentences a decoder finished in one call (None answers not counted)."""

    def __init__(self, model: CpuDecoder) -> None:
        self.count = 0
        self.model = model
        self.original = model.finish_sentence

    def __call__(
        self, sentence: OpenSentence, memory: Any, src_mask: Tensor, cache: Any
    ) -> list[Ended] | None:
        ended = self.original(sentence, memory, src_mask, cache)
        self.count += ended is not None
        return ended


@pytest.fixture
def handovers() -> Iterator[Callable[[CpuDecoder], Handovers]]:
    def spy(model: CpuDecoder) -> Handovers:
        counter = Handovers(model)
        model.finish_sentence = counter  # type: ignore[method-assign]
        return counter

    yield spy


def _by_search_loop(model: CpuDecoder, run: Callable[[], list]) -> list:
    """`run()` with the model's fast route set aside: search's own loop every step."""
    finish = model.finish_sentence
    model.finish_sentence = lambda *step: search_loop_only(model, *step)  # type: ignore[method-assign]
    try:
        return run()
    finally:
        model.finish_sentence = finish  # type: ignore[method-assign]


def _found(result: list[list[Hypothesis]]) -> list:
    return [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in result]


def _sentences() -> list[Tensor]:
    """Four sources of different lengths, each a batch of its own."""
    g = torch.Generator().manual_seed(7)
    lengths = [9, 6, 2, 12]
    return [
        torch.cat([torch.randint(4, 50, (1, n - 1), generator=g), torch.tensor([[3]])], 1)
        for n in lengths
    ]


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize(
    ("beam", "nbest", "alpha", "max_len_b"),
    [(4, 1, 0.6, 3), (4, 2, 0.6, 12), (1, 1, 0.6, 8), (5, 3, -0.4, 6), (3, 1, 0.0, 10)],
)
def test_one_call_finds_what_search_loop_finds(
    kernel_at: Callable[[str], ModuleType],
    handovers: Callable[[CpuDecoder], Handovers],
    level: str,
    precision: str,
    beam: int,
    nbest: int,
    alpha: float,
    max_len_b: int,
) -> None:
    """Random models run their sentences to the length limit: EOS forced at the limit,
    every beam ending there, n-best lists filled at the end."""
    model = decode_model(precision, kernel_at(level), compiled=True)
    spy = handovers(model)
    for src in _sentences():

        def run(src: Tensor = src) -> list:
            return beam_search(model, src, beam, alpha, 0.5, max_len_b, nbest)

        fast = run()
        assert _found(fast) == _found(_by_search_loop(model, run))
    if model.own_arithmetic is not None:
        assert spy.count == len(_sentences())
    else:  # bf16 where the products are PyTorch's: no fused choice, no one-call route
        assert spy.count == 0


@pytest.fixture
def reverser_at(
    reverser: Transformer, kernel_at: Callable[[str], ModuleType]
) -> Callable[[str, str], CpuDecoder]:
    def build(precision: str, level: str) -> CpuDecoder:
        return wrap(copy.deepcopy(reverser), precision, kernel_at(level), compiled=True)

    return build


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize(("nbest", "alpha"), [(1, 0.6), (2, 0.6), (1, 1.5), (2, -0.5)])
def test_sentences_that_end_early_stop_at_the_same_step(
    reverser_at: Callable[[str, str], CpuDecoder],
    handovers: Callable[[CpuDecoder], Handovers],
    level: str,
    precision: str,
    nbest: int,
    alpha: float,
) -> None:
    """A trained model ends its sentences long before their limit: the stopping bound
    decides, with finished hypotheses set aside at several steps."""
    model = reverser_at(precision, level)
    spy = handovers(model)
    src = reverse_batch(6, torch.Generator().manual_seed(3))[0]
    for i in range(src.size(0)):
        sentence = src[i : i + 1, : int((src[i] != 0).sum())]

        def run(sentence: Tensor = sentence) -> list:
            return beam_search(model, sentence, 4, alpha, nbest=nbest)

        fast = run()
        assert _found(fast) == _found(_by_search_loop(model, run))
        assert 0 < len(fast[0][0].tokens) < 40
    assert spy.count == src.size(0)


def test_the_last_sentence_of_a_batch_is_finished_in_one_call(
    reverser_at: Callable[[str, str], CpuDecoder],
    handovers: Callable[[CpuDecoder], Handovers],
) -> None:
    """Sentences of a batch end at different steps; once one is left alone in the batch
    (the others have left it), it is handed over, and the batch's results are search's
    loop's."""
    model = reverser_at("fp32", "native")
    spy = handovers(model)
    pool = reverse_batch(64, torch.Generator().manual_seed(0))[0]
    lengths = (pool != 0).sum(1) - 1
    # one sentence of each length: the longest ends last, alone in the batch
    src = torch.stack([pool[int((lengths == n).nonzero()[0])] for n in (2, 5, 3)])

    def run() -> list:
        return beam_search(model, src, 4, nbest=2)

    fast = run()
    assert _found(fast) == _found(_by_search_loop(model, run))
    assert spy.count == 1


def test_recording_attention_runs_search_loop(
    kernel: ModuleType, handovers: Callable[[CpuDecoder], Handovers]
) -> None:
    model = decode_model("fp32", kernel, compiled=True)
    spy = handovers(model)
    src = _sentences()[0]
    recorded = beam_search(model, src, 4, max_len_b=5, need_weights=True)
    assert spy.count == 0
    assert recorded[0][0].attention is not None
    assert _found(recorded) == _found(beam_search(model, src, 4, max_len_b=5))
    assert spy.count == 1


def test_a_cache_without_room_for_the_limit_keeps_search_loop(
    kernel: ModuleType, handovers: Callable[[CpuDecoder], Handovers], monkeypatch: Any
) -> None:
    """A cache told nothing of the length limit grows as it goes: the one-call route,
    which grows nothing, declines, and search's loop finds the same."""
    model = decode_model("fp32", kernel, compiled=True)
    src = _sentences()[3]
    expected = beam_search(model, src, 4, max_len_b=38)
    monkeypatch.setattr(SlotCache, "reserve", lambda self, steps: None)
    spy = handovers(model)
    assert _found(beam_search(model, src, 4, max_len_b=38)) == _found(expected)
    assert spy.count == 0
