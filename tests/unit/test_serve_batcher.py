"""The cross-request queue of `nmt serve`, with a stand-in for the model: what is decoded
together, what each job gets back, and what is never decoded."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import pytest

from nmt_cli.engines.serve.batcher import (
    WAIT_SHARE,
    Batcher,
    DeadlineExceeded,
    Options,
    QueueFull,
    Stopping,
)
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.translate.translator import TranslatedHypothesis, Translation

PLAIN, WIDE = Options(beam=4, nbest=1), Options(beam=8, nbest=2)


class Model:
    """Translates a line into its upper case; records each call; can be held."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds  # how long each call takes
        self.calls: list[tuple[list[str], Options]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.taken: list[int] = []  # each call's sentences, when it starts
        self.starts: list[float] = []  # each call's time.monotonic(), when it starts

    def decode(self, lines: list[str], options: Options) -> list[Translation]:
        self.taken.append(len(lines))
        self.starts.append(time.monotonic())
        self.started.set()
        self.gate.wait(10)
        time.sleep(self.seconds)
        self.calls.append((list(lines), options))
        return [
            Translation(line, [TranslatedHypothesis(line.upper(), 0.0, 0.0, len(line))])
            for line in lines
        ]


def batcher(model: Model, limit: int = 100, max_batch: int = 10, gather_s: float = 0.05) -> Batcher:
    return Batcher("en-de", model.decode, Metrics(), limit, max_batch, gather_s)


def texts(job_result: list[Translation]) -> list[str]:
    return [t.text for t in job_result]


def test_jobs_within_the_window_are_decoded_together_and_answered_in_order() -> None:
    model = Model()
    queue = batcher(model, gather_s=0.2)
    jobs = [queue.submit([f"s{i}a", f"s{i}b"], PLAIN, 10) for i in range(3)]
    queue.start()
    for i, job in enumerate(jobs):
        assert texts(job.future.result(5)) == [f"S{i}A", f"S{i}B"]
    assert model.calls == [(["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"], PLAIN)]
    assert 'nmt_batch_sentences_count{pair="en-de"} 1' in queue.metrics.render({}, True)
    queue.stop(5)


def test_a_batch_is_full_at_max_batch_and_options_decode_apart() -> None:
    model = Model()
    queue = batcher(model, max_batch=4, gather_s=0.5)
    jobs = [
        queue.submit(["a", "b"], PLAIN, 10),
        queue.submit(["c"], WIDE, 10),
        queue.submit(["d"], PLAIN, 10),
        queue.submit(["e", "f"], PLAIN, 10),  # would make 6: the next batch
    ]
    start = time.monotonic()
    queue.start()
    for job in jobs:
        job.future.result(5)
    assert model.calls[:2] == [(["a", "b", "d"], PLAIN), (["c"], WIDE)]
    assert model.calls[2] == (["e", "f"], PLAIN)
    assert time.monotonic() - start < 5
    queue.stop(5)


def test_a_full_queue_refuses_at_once_and_memory_stays_bounded() -> None:
    queue = batcher(Model(), limit=5)
    queue.submit(["a", "b", "c"], PLAIN, 10)
    with pytest.raises(QueueFull):
        queue.submit(["d", "e", "f"], PLAIN, 10)
    assert queue.queued == 3
    queue.submit(["d", "e"], PLAIN, 10)
    assert queue.queued == 5


def test_withdrawn_and_expired_jobs_are_never_decoded() -> None:
    model = Model()
    model.gate.clear()
    queue = batcher(model, gather_s=0.0)
    busy = queue.submit(["busy"], PLAIN, 10)
    queue.start()
    assert model.started.wait(5)  # "busy" is being decoded
    left = queue.submit(["left"], PLAIN, 10)
    late = queue.submit(["late"], PLAIN, 0.01)
    kept = queue.submit(["kept"], PLAIN, 10)
    assert queue.withdraw(left, "disconnected") and not queue.withdraw(busy, "disconnected")
    time.sleep(0.05)
    model.gate.set()
    assert texts(kept.future.result(5)) == ["KEPT"]
    with pytest.raises(DeadlineExceeded):
        late.future.result(5)
    with pytest.raises(CancelledError):
        left.future.result(0)
    assert [lines for lines, _ in model.calls] == [["busy"], ["kept"]]
    text = queue.metrics.render({}, True)
    assert 'nmt_dropped_sentences_total{pair="en-de",reason="disconnected"} 1' in text
    assert 'nmt_dropped_sentences_total{pair="en-de",reason="timeout"} 1' in text
    queue.stop(5)


def test_a_failing_batch_fails_its_jobs_and_the_queue_goes_on() -> None:
    model = Model()
    calls = 0

    def decode(lines: list[str], options: Options) -> list[Translation]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return model.decode(lines, options)

    queue = Batcher("en-de", decode, Metrics(), 100, 10, 0.0)
    queue.start()
    with pytest.raises(RuntimeError, match="boom"):
        queue.submit(["a"], PLAIN, 10).future.result(5)
    assert texts(queue.submit(["b"], PLAIN, 10).future.result(5)) == ["B"]
    queue.stop(5)


def test_stopping_refuses_new_work_and_answers_what_waited() -> None:
    model = Model()
    queue = batcher(model)
    waiting = queue.submit(["a"], PLAIN, 10)
    assert queue.stop(1)  # never started: nothing to wait for
    with pytest.raises(Stopping):
        waiting.future.result(0)
    with pytest.raises(Stopping):
        queue.submit(["b"], PLAIN, 10)
    assert model.calls == []


def test_free_lanes_share_what_waits_and_decode_side_by_side() -> None:
    """Two lanes (a lane a worker process): eight waiting sentences become two batches of
    four, decoded at the same time, and each job still gets its own answer."""
    model = Model()
    model.gate.clear()
    inside = threading.Semaphore(0)

    def decode(lines: list[str], options: Options) -> list[Translation]:
        inside.release()
        return model.decode(lines, options)

    queue = Batcher("en-de", decode, Metrics(), 100, 10, 0.1, lanes=2)
    jobs = [queue.submit([f"s{i}"], PLAIN, 10) for i in range(8)]
    queue.start()
    assert inside.acquire(timeout=5) and inside.acquire(timeout=5)  # both lanes inside
    model.gate.set()
    assert [texts(job.future.result(5)) for job in jobs] == [[f"S{i}"] for i in range(8)]
    assert sorted(len(lines) for lines, _ in model.calls) == [4, 4]
    assert 'nmt_decoding_sentences{pair="en-de"} 0' in queue.metrics.render({}, True)
    assert queue.stop(5)


def test_a_free_lane_takes_an_even_share_of_the_work_not_all_that_waits() -> None:
    """One lane is decoding 1 sentence when 9 arrive: the free lane takes 5 (half of the
    10), not 9, and leaves 4 for the busy lane, so that neither lane settles into large
    batches beside the other's small ones."""
    model = Model()
    model.gate.clear()
    queue = Batcher("en-de", model.decode, Metrics(), 100, 64, 0.2, lanes=2)
    queue.start()
    first = queue.submit(["x"], PLAIN, 10)
    assert model.started.wait(5)  # one lane holds "x"
    time.sleep(0.3)  # past "x"'s gather window: the other lane waits for new work
    jobs = [queue.submit([f"s{i}"], PLAIN, 10) for i in range(9)]
    time.sleep(0.5)  # the free lane gathers for 0.2 s, then takes its share
    assert queue.queued == 4
    assert sorted(model.taken) == [1, 5]
    model.gate.set()  # then whichever lane is free first takes its share of the 4
    assert texts(first.future.result(5)) == ["X"]
    assert [texts(job.future.result(5)) for job in jobs] == [[f"S{i}"] for i in range(9)]
    assert sum(model.taken) == 10
    assert queue.stop(5)


@pytest.mark.parametrize(
    ("seconds", "share", "batches"),
    [(0.5, 1.0, [4, 4, 1]), (0.0, WAIT_SHARE, [4, 1, 3, 1])],
    ids=["slow batch: waits", "quick batch: no wait"],
)
def test_a_lane_that_answered_waits_briefly_for_those_clients_to_come_back(
    seconds: float, share: float, batches: list[int]
) -> None:
    """Closed-loop clients send their next sentence as soon as they have their answer:
    the lane that answered them takes them together instead of leaving them queued, and
    waits for them at most its share of the time the batch took (a batch that took no
    time earns no wait: the late clients are the next batch)."""
    model = Model(seconds)
    queue = Batcher("en-de", model.decode, Metrics(), 100, 10, 0.0, return_s=2.0, wait_share=share)
    first = [queue.submit([f"a{i}"], PLAIN, 10) for i in range(4)]
    queue.start()
    for job in first:
        job.future.result(5)
    # One client is back at once, the other three a little later.
    again = [queue.submit(["b0"], PLAIN, 10)]
    time.sleep(0.2)
    again += [queue.submit([f"b{i}"], PLAIN, 10) for i in range(1, 4)]
    for job in again:
        job.future.result(5)
    # A client that does not come back costs at most the wait: the batch's time.
    start = time.monotonic()
    alone = queue.submit(["c"], PLAIN, 10)
    assert texts(alone.future.result(5)) == ["C"]
    assert time.monotonic() - start < 1.5
    assert model.taken == batches
    queue.stop(5)


def test_a_lane_whose_clients_are_all_back_decodes_at_once() -> None:
    """The return wait ends once as many sentences have come as the lane answered,
    counted from its answers: clients back within a millisecond are decoded then, not
    after the whole wait (the lane once counted them twice and waited for more)."""
    model = Model(0.5)  # each batch takes 0.5 s: a wait of up to 0.5 s is allowed
    queue = Batcher("en-de", model.decode, Metrics(), 100, 10, 0.0, return_s=2.0, wait_share=1.0)
    first = [queue.submit([f"a{i}"], PLAIN, 10) for i in range(4)]
    queue.start()
    for job in first:
        job.future.result(5)
    again = [queue.submit([f"b{i}"], PLAIN, 10) for i in range(4)]
    back = time.monotonic()
    assert [texts(job.future.result(5)) for job in again] == [[f"B{i}"] for i in range(4)]
    assert model.taken == [4, 4]
    assert model.starts[1] - back < 0.25
    queue.stop(5)


def test_the_gather_window_holds_a_request_only_while_another_lane_decodes() -> None:
    """With every lane idle a request is decoded at once (a gather window would only delay
    a lone client); while one lane decodes, a free lane with no batch behind it gathers
    for the whole window."""
    model = Model()
    model.gate.clear()
    queue = Batcher("en-de", model.decode, Metrics(), 100, 10, 0.6, lanes=2)
    queue.start()
    start = time.monotonic()
    first = queue.submit(["a"], PLAIN, 10)
    assert model.started.wait(5)
    assert time.monotonic() - start < 0.3
    second = queue.submit(["b"], PLAIN, 10)
    time.sleep(0.3)
    assert model.taken == [1]  # "b" is gathering
    time.sleep(0.6)
    assert model.taken == [1, 1]
    model.gate.set()
    assert texts(first.future.result(5)) == ["A"] and texts(second.future.result(5)) == ["B"]
    assert queue.stop(5)


def test_the_gather_window_is_bounded_by_the_lanes_last_batch() -> None:
    """After a quick batch, a lane gathers for a fraction of that batch's time at most,
    even while the other lane decodes."""
    model = Model()
    model.gate.clear()
    queue = Batcher("en-de", model.decode, Metrics(), 100, 10, 0.6, lanes=2)
    warm = [queue.submit([f"w{i}"], PLAIN, 10) for i in range(2)]
    queue.start()
    deadline = time.monotonic() + 5
    while len(model.taken) < 2 and time.monotonic() < deadline:  # a lane each
        time.sleep(0.01)
    model.gate.set()  # both lanes' last batches: a few milliseconds
    for job in warm:
        job.future.result(5)
    model.gate.clear()
    held = queue.submit(["a"], PLAIN, 10)  # all idle: one lane takes it at once
    time.sleep(0.05)
    start = time.monotonic()
    late = queue.submit(["b"], PLAIN, 10)  # the other lane, its last batch quick
    while len(model.taken) < 4 and time.monotonic() < start + 5:
        time.sleep(0.005)
    assert time.monotonic() - start < 0.3
    model.gate.set()
    assert texts(held.future.result(5)) == ["A"] and texts(late.future.result(5)) == ["B"]
    assert model.taken == [1, 1, 1, 1]
    assert queue.stop(5)
