"""A one-sentence search finished by the compiled step in one call (CpuDecoder's
finish_sentence, csrc/decoder_step.cpp) is search's own loop exactly: the same
hypotheses, scores and log-probabilities for every precision and CPU level, beam width,
n-best, length penalty and length limit, for sentences that end early and those that
reach their limit, alone or as the last one left of a batch; and search hands nothing
over where it records attention or where the cache would have to grow."""

from __future__ import annotations

import copy
import signal
import time
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
        self.steps: list[int] = []  # the step each one was handed over at
        self.model = model
        self.original = model.finish_sentence

    def __call__(
        self, sentence: OpenSentence, memory: Any, src_mask: Tensor, cache: Any
    ) -> list[Ended] | None:
        ended = self.original(sentence, memory, src_mask, cache)
        self.count += ended is not None
        self.steps += [] if ended is None else [sentence.step]
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
    if model.own_arithmetic is not None:  # a batch of one: from its first step
        assert spy.steps == [0] * len(_sentences())
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
    assert spy.steps[0] > 0  # after the others left


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


class _Interrupted(Exception):
    pass


def test_a_signal_during_the_one_call_is_handled_between_its_steps(kernel: ModuleType) -> None:
    """Ctrl-C (here a timer's handler that raises) reaches Python between two steps of
    the one call, as it did between two calls of search's loop: a quarter of the way
    through a long sentence, the exception comes long before the sentence would end."""
    model = decode_model(
        "fp32", kernel, compiled=True, d_model=256, d_ff=1024, src_vocab_size=8000,
        tgt_vocab_size=8000, max_positions=400,
    )  # fmt: skip
    if not model._finishes_sentences():
        pytest.skip("no one-call route on this CPU (the module's fp32 kernels need AVX2)")
    src = _sentences()[3]

    def search() -> list:
        return beam_search(model, src, 4, max_len_a=0.0, max_len_b=390)  # 390 steps

    start = time.perf_counter()
    assert len(search()[0][0].tokens) == 390  # a random model runs to its limit
    whole = time.perf_counter() - start

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, whole / 4)
        with pytest.raises(_Interrupted) as raised:
            search()
        interrupted_after = time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert "finish_sentence" in [entry.name for entry in raised.traceback]
    assert interrupted_after < 0.75 * whole, (interrupted_after, whole)
