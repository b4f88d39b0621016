"""The cross-request queue of `nmt serve`.

The batching rule (when a lane waits, what it takes) is a set of pure functions of the
queue's counts and clock readings, checked here on every small case. The queue itself runs
with a stand-in model and a fake clock, whose time moves only when a test says: each test
asserts what the clients get (answers, their order, what was decoded with what, counts),
and what a lane does never depends on how fast this machine runs it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nmt_cli.engines.serve.batcher import (
    Backlog,
    Batcher,
    Clock,
    DeadlineExceeded,
    Fate,
    Job,
    LastBatch,
    Options,
    QueueFull,
    Rule,
    Stopping,
    Wait,
    Waiting,
    lane_share,
    plan_wait,
    take,
    wait_left,
)
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.translate.translator import TranslatedHypothesis, Translation

PLAIN, WIDE = Options(beam=4, nbest=1), Options(beam=8, nbest=2)
D, E, C = Fate.DECODE, Fate.EXPIRED, Fate.CANCELLED
NOW = 100.0
SECONDS = 5.0  # a generous real-time bound on a step a correct queue takes at once


# --- the rule: what a lane takes ----------------------------------------------------------


def live(sentences: int) -> Waiting:
    return Waiting(sentences, deadline=NOW + 1)


def expired(sentences: int) -> Waiting:
    return Waiting(sentences, deadline=NOW)


def cancelled(sentences: int) -> Waiting:
    return Waiting(sentences, deadline=NOW + 1, cancelled=True)


@pytest.mark.parametrize(
    ("queue", "most", "fates"),
    [
        ([], 4, []),
        ([live(2), live(1), live(1), live(2)], 4, [D, D, D]),  # the 4th would make 6
        ([live(7), live(1)], 4, [D]),  # a request larger than the share goes whole, alone
        ([live(1), live(7)], 4, [D]),  # ... but never joins a batch it would overflow
        ([expired(3), live(3), live(1)], 4, [E, D, D]),  # the expired job does not count
        ([cancelled(3), live(4)], 4, [C, D]),
        ([live(4), expired(1)], 4, [D]),  # past the share it stays queued, for the next
        ([expired(1), cancelled(1)], 4, [E, C]),  # nothing to decode: all leave
        ([live(1)] * 9, 5, [D] * 5),
    ],
)
def test_a_lane_takes_whole_requests_in_arrival_order_up_to_its_share(
    queue: list[Waiting], most: int, fates: list[Fate]
) -> None:
    assert take(queue, most, NOW) == fates


def check_take(queue: list[Waiting], most: int) -> None:
    """`take`'s result, against its definition: the longest head of the queue whose
    decoded sentences fit in `most`, or the first job to decode alone; expired and
    cancelled jobs in it leave without counting; the queue is read no further."""
    read = 0

    def reading() -> Iterator[Waiting]:
        nonlocal read
        for job in queue:
            read += 1
            yield job

    fates = take(reading(), most, NOW)
    k = len(fates)
    assert k <= len(queue) and read <= k + 1
    for job, fate in zip(queue, fates, strict=False):
        assert fate is (E if job.deadline <= NOW else C if job.cancelled else D)
    sizes = [job.sentences for job, fate in zip(queue, fates, strict=False) if fate is D]
    assert sum(sizes) <= most or len(sizes) == 1
    # every job of the head was allowed in, and the next one would not have been
    for i in range(k + 1 if k < len(queue) else k):
        before = [j.sentences for j, f in zip(queue[:i], fates[:i], strict=True) if f is D]
        fits = not before or sum(before) + queue[i].sentences <= most
        assert fits == (i < k), (queue, most, fates, i)


def test_take_on_every_small_queue() -> None:
    kinds = [live, expired, cancelled]
    jobs = [kind(n) for kind in kinds for n in (1, 2, 3)]
    for length in range(5):
        for queue in itertools.product(jobs, repeat=length):
            for most in range(1, 8):
                check_take(list(queue), most)


@given(
    st.lists(st.tuples(st.integers(1, 128), st.sampled_from([live, expired, cancelled]))),
    st.integers(1, 256),
)
def test_take_on_any_queue(jobs: list[tuple[int, Callable[[int], Waiting]]], most: int) -> None:
    check_take([kind(n) for n, kind in jobs], most)


# --- the rule: how much a lane takes ------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "decoding", "lanes", "max_batch", "most"),
    [
        (8, 0, 2, 10, 4),  # two idle lanes split what waits
        (9, 1, 2, 64, 5),  # one lane decodes 1 when 9 come: the free lane takes 5, not 9
        (63, 1, 2, 64, 32),  # the other's batch counts: 64 sentences, 32 each
        (63, 0, 1, 64, 63),  # one lane takes all that waits
        (100, 0, 1, 64, 64),  # at most a full batch
        (1, 40, 2, 64, 21),  # a share may be more than waits: the rest is the other's
    ],
)
def test_a_lane_shares_all_the_work_there_is_evenly(
    queued: int, decoding: int, lanes: int, max_batch: int, most: int
) -> None:
    backlog = Backlog(jobs=queued, queued=queued, arrived=queued, decoding=decoding)
    assert lane_share(Rule(max_batch, 0.0, lanes=lanes), backlog) == most


def test_the_share_on_every_small_backlog() -> None:
    for queued, decoding, lanes, max_batch in itertools.product(
        range(41), range(41), range(1, 5), range(1, 13)
    ):
        backlog = Backlog(queued, queued, queued, decoding)
        most = lane_share(Rule(max_batch, 0.0, lanes=lanes), backlog)
        # the least n with n lanes' shares covering all the work, or a full batch
        assert most <= max_batch and (most - 1) * lanes < queued + decoding
        assert most == max_batch or most * lanes >= queued + decoding


def test_a_rule_needs_a_lane_and_a_batch() -> None:
    with pytest.raises(ValueError, match="a lane and a batch"):
        Rule(10, 0.0, lanes=0)
    with pytest.raises(ValueError, match="a lane and a batch"):
        Rule(0, 0.0)


# --- the rule: when a lane waits and when it goes ---------------------------------------------


def backlog(queued: int = 1, decoding: int = 0, arrived: int = 1, jobs: int = 1) -> Backlog:
    return Backlog(jobs=jobs, queued=queued, arrived=arrived, decoding=decoding)


def test_an_idle_server_decodes_a_request_at_once() -> None:
    rule = Rule(10, gather_s=0.5, return_s=0.5)
    for last in [LastBatch(), LastBatch(answered=0, mark=3, took_s=2.0)]:
        wait = plan_wait(rule, last, backlog(decoding=0), first=NOW, now=NOW)
        assert wait_left(rule, wait, backlog(decoding=0), NOW) == 0.0


def test_a_free_lane_gathers_while_another_decodes_for_the_window_at_most() -> None:
    rule = Rule(10, gather_s=0.5)
    busy = backlog(decoding=3)
    wait = plan_wait(rule, LastBatch(), busy, first=NOW - 0.25, now=NOW)
    assert wait == Wait(until=NOW + 0.25, want=None)  # the window counts from the first
    assert wait_left(rule, wait, busy, NOW) == 0.25
    assert wait_left(rule, wait, busy, NOW + 0.25) == 0.0  # the window is over
    assert wait_left(rule, wait, backlog(queued=10, decoding=3), NOW) == 0.0  # a full batch
    assert wait_left(rule, wait, backlog(queued=0, jobs=0, decoding=3), NOW) == 0.0  # withdrawn


def test_a_lane_waits_for_the_clients_it_answered_counted_from_its_answers() -> None:
    rule = Rule(10, gather_s=0.0, return_s=2.0, wait_share=1.0)
    last = LastBatch(answered=4, mark=20, took_s=0.5)  # wait: at most the batch's 0.5 s
    wait = plan_wait(rule, last, backlog(arrived=21), first=NOW, now=NOW)
    assert wait == Wait(until=NOW + 0.5, want=24)
    assert wait_left(rule, wait, backlog(arrived=23, queued=3), NOW) == 0.5
    assert wait_left(rule, wait, backlog(arrived=24, queued=4), NOW) == 0.0  # all back
    assert wait_left(rule, wait, backlog(arrived=23, queued=3), NOW + 0.5) == 0.0  # one not
    assert wait_left(rule, wait, backlog(arrived=23, queued=10), NOW) == 0.0  # a full batch
    # a client withdrawn meanwhile does not end the wait: the others may still come
    assert wait_left(rule, wait, backlog(arrived=23, queued=0, jobs=0), NOW) == 0.5


@pytest.mark.parametrize(
    ("took_s", "share", "waits"),
    [(0.5, 1.0, 0.5), (0.5, 0.03, 0.015), (100.0, 0.03, 1.0), (0.0, 0.03, None)],
    ids=["the batch's time", "3% of it", "return_s", "a batch that took no time: none"],
)
def test_the_return_wait_is_bounded_by_the_last_batchs_time(
    took_s: float, share: float, waits: float | None
) -> None:
    rule = Rule(10, gather_s=0.0, return_s=1.0, wait_share=share)
    wait = plan_wait(rule, LastBatch(4, 20, took_s), backlog(), first=NOW, now=NOW)
    if waits is None:
        assert wait == Wait(until=NOW, want=None)  # a gather of nothing: go
    else:
        assert wait.want == 24 and wait.until - NOW == pytest.approx(waits)


def test_waits_on_every_small_case() -> None:
    """Whichever wait a lane plans lasts the smallest of its bounds, and ends exactly when
    its time is up, a full batch waits, or what it waits for has come."""
    grid = itertools.product(
        [0, 4],  # answered
        [None, 0.0, 0.5, 2.0],  # took_s
        [0.0, 0.25, 1.0],  # return_s
        [0.0, 0.125, 1.0],  # gather_s
        [0.03, 0.5, 1.0],  # wait_share
        [0, 3],  # decoding
        [NOW - 0.5, NOW],  # when the first job came
    )
    for answered, took_s, return_s, gather_s, wait_share, decoding, first in grid:
        rule = Rule(8, gather_s, return_s, wait_share)
        state = backlog(decoding=decoding, arrived=12)
        wait = plan_wait(rule, LastBatch(answered, 10, took_s), state, first, NOW)
        cap = float("inf") if took_s is None else wait_share * took_s
        if answered and min(return_s, cap) > 0:
            assert wait == Wait(NOW + min(return_s, cap), want=10 + answered)
        else:
            assert wait == Wait(first + (min(gather_s, cap) if decoding else 0.0), want=None)
        for now, queued, arrived, jobs in itertools.product(
            [NOW, NOW + 0.25, wait.until, wait.until + 1], [0, 3, 7, 8], [11, 14, 15], [0, 2]
        ):
            left = wait_left(rule, wait, Backlog(jobs, queued, arrived, decoding), now)
            come = arrived >= wait.want if wait.want is not None else jobs == 0
            go = now >= wait.until or queued >= 8 or come
            assert left == (0.0 if go else wait.until - now)


# --- the queue, with a stand-in model and a fake clock -----------------------------------


class FakeClock(Clock):
    """Time that moves only by `advance`. It counts the lanes' timed waits, so that a test
    can see that a lane has chosen to wait before it acts."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start
        self.timed_waits = 0
        self._seen = threading.Condition()
        self._conds: set[threading.Condition] = set()

    def now(self) -> float:
        with self._seen:
            return self.time

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        with self._seen:
            self._conds.add(cond)
            if timeout is not None:
                self.timed_waits += 1
                self._seen.notify_all()
        cond.wait()  # a change of the queue, or `advance`: this time runs out no other way

    def advance(self, seconds: float) -> None:
        with self._seen:
            self.time += seconds
            conds = list(self._conds)
        for cond in conds:
            with cond:
                cond.notify_all()

    def await_timed_waits(self, count: int) -> None:
        with self._seen:
            assert self._seen.wait_for(lambda: self.timed_waits >= count, SECONDS), (
                f"{self.timed_waits} timed waits, expected {count}"
            )


class Model:
    """Translates a line into its upper case, taking `seconds` of the fake clock; records
    each call; can be held at its start."""

    def __init__(self, clock: FakeClock, seconds: float = 0.0) -> None:
        self.clock, self.seconds = clock, seconds
        self.calls: list[tuple[list[str], Options]] = []
        self.taken: list[int] = []  # each call's sentences, when it starts
        self.starts: list[float] = []  # each call's clock reading, when it starts
        self.gate = threading.Event()
        self.gate.set()
        self._changed = threading.Condition()

    def decode(self, lines: list[str], options: Options) -> list[Translation]:
        with self._changed:
            self.taken.append(len(lines))
            self.starts.append(self.clock.now())
            self._changed.notify_all()
        assert self.gate.wait(SECONDS)
        self.clock.advance(self.seconds)
        self.calls.append((list(lines), options))
        return [
            Translation(line, [TranslatedHypothesis(line.upper(), 0.0, 0.0, len(line))])
            for line in lines
        ]

    def await_calls(self, count: int) -> None:
        """Until `count` calls have started."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.taken) >= count, SECONDS), (
                f"{self.taken}: expected {count} calls"
            )


@contextmanager
def running(model: Model, rule: Rule, limit: int = 100, start: bool = True) -> Iterator[Batcher]:
    queue = Batcher("en-de", model.decode, Metrics(), limit, rule, model.clock)
    if start:
        queue.start()
    try:
        yield queue
    finally:
        model.gate.set()
        assert queue.stop(SECONDS)


def texts(job: Job) -> list[str]:
    return [t.text for t in job.future.result(SECONDS)]


def come_back(job: Job, queue: Batcher, line: str, again: list[Job]) -> None:
    """A closed-loop client: it sends `line` the moment `job` is answered (in the lane's
    own thread, before the lane looks at the queue again)."""
    job.future.add_done_callback(lambda _: again.append(queue.submit([line], PLAIN, 10)))


def test_jobs_queued_together_are_decoded_together_and_answered_in_order() -> None:
    model = Model(FakeClock())
    with running(model, Rule(10, gather_s=0.2), start=False) as queue:
        jobs = [queue.submit([f"s{i}a", f"s{i}b"], PLAIN, 10) for i in range(3)]
        queue.start()
        assert [texts(job) for job in jobs] == [[f"S{i}A", f"S{i}B"] for i in range(3)]
        assert model.calls == [(["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"], PLAIN)]
        assert 'nmt_batch_sentences_count{pair="en-de"} 1' in queue.metrics.render({}, True)


def test_a_batch_is_full_at_max_batch_and_options_decode_apart() -> None:
    model = Model(FakeClock())
    with running(model, Rule(4, gather_s=0.5), start=False) as queue:
        jobs = [
            queue.submit(["a", "b"], PLAIN, 10),
            queue.submit(["c"], WIDE, 10),
            queue.submit(["d"], PLAIN, 10),
            queue.submit(["e", "f"], PLAIN, 10),  # would make 6: the next batch
        ]
        queue.start()
        assert [texts(job) for job in jobs] == [["A", "B"], ["C"], ["D"], ["E", "F"]]
        assert model.calls == [(["a", "b", "d"], PLAIN), (["c"], WIDE), (["e", "f"], PLAIN)]


def test_a_full_queue_refuses_at_once_and_memory_stays_bounded() -> None:
    with running(Model(FakeClock()), Rule(10, 0.0), limit=5, start=False) as queue:
        queue.submit(["a", "b", "c"], PLAIN, 10)
        with pytest.raises(QueueFull):
            queue.submit(["d", "e", "f"], PLAIN, 10)
        assert queue.queued == 3
        queue.submit(["d", "e"], PLAIN, 10)
        assert queue.queued == 5


def test_withdrawn_and_expired_jobs_are_never_decoded() -> None:
    clock = FakeClock()
    model = Model(clock)
    model.gate.clear()
    with running(model, Rule(10, gather_s=0.0)) as queue:
        busy = queue.submit(["busy"], PLAIN, 10)
        model.await_calls(1)  # "busy" is being decoded
        left = queue.submit(["left"], PLAIN, 10)
        late = queue.submit(["late"], PLAIN, 1)
        kept = queue.submit(["kept"], PLAIN, 10)
        assert queue.withdraw(left, "disconnected") and not queue.withdraw(busy, "disconnected")
        clock.advance(2)  # past "late"'s deadline, not "kept"'s
        model.gate.set()
        assert texts(busy) == ["BUSY"] and texts(kept) == ["KEPT"]
        with pytest.raises(DeadlineExceeded):
            late.future.result(SECONDS)
        with pytest.raises(CancelledError):
            left.future.result(0)
        assert [lines for lines, _ in model.calls] == [["busy"], ["kept"]]
        text = queue.metrics.render({}, True)
        assert 'nmt_dropped_sentences_total{pair="en-de",reason="disconnected"} 1' in text
        assert 'nmt_dropped_sentences_total{pair="en-de",reason="timeout"} 1' in text


def test_a_failing_batch_fails_its_jobs_and_the_queue_goes_on() -> None:
    model = Model(FakeClock())
    calls = 0

    def decode(lines: list[str], options: Options) -> list[Translation]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return model.decode(lines, options)

    queue = Batcher("en-de", decode, Metrics(), 100, Rule(10, 0.0), model.clock)
    queue.start()
    with pytest.raises(RuntimeError, match="boom"):
        queue.submit(["a"], PLAIN, 10).future.result(SECONDS)
    assert texts(queue.submit(["b"], PLAIN, 10)) == ["B"]
    assert queue.stop(SECONDS)


def test_stopping_refuses_new_work_and_answers_what_waited() -> None:
    model = Model(FakeClock())
    queue = Batcher("en-de", model.decode, Metrics(), 100, Rule(10, 0.05), model.clock)
    waiting = queue.submit(["a"], PLAIN, 10)
    assert queue.stop(1)  # never started: nothing to wait for
    with pytest.raises(Stopping):
        waiting.future.result(0)
    with pytest.raises(Stopping):
        queue.submit(["b"], PLAIN, 10)
    assert model.calls == []
    assert 'nmt_dropped_sentences_total{pair="en-de",reason="stopping"} 1' in (
        queue.metrics.render({}, True)
    )


def test_free_lanes_share_what_waits_and_decode_side_by_side() -> None:
    """Two lanes (a lane a worker process): eight sentences that waited past the gather
    window become two batches of four, decoded at the same time, and each job still gets
    its own answer."""
    model = Model(FakeClock())
    model.gate.clear()
    with running(model, Rule(10, gather_s=0.1, lanes=2), start=False) as queue:
        jobs = [queue.submit([f"s{i}"], PLAIN, 10) for i in range(8)]
        model.clock.advance(1)
        queue.start()
        model.await_calls(2)  # both lanes inside
        assert model.taken == [4, 4] and queue.queued == 0
        model.gate.set()
        assert [texts(job) for job in jobs] == [[f"S{i}"] for i in range(8)]
        assert sorted(lines for lines, _ in model.calls) == [
            ["s0", "s1", "s2", "s3"],
            ["s4", "s5", "s6", "s7"],
        ]
        assert 'nmt_decoding_sentences{pair="en-de"} 0' in queue.metrics.render({}, True)


def test_a_free_lane_takes_an_even_share_of_the_work_not_all_that_waits() -> None:
    """One lane is decoding 1 sentence when 9 arrive: at the end of its gather window the
    free lane takes 5 (half of the 10), not 9, and leaves 4 for the busy lane, so that
    neither lane settles into large batches beside the other's small ones."""
    model = Model(FakeClock())
    model.gate.clear()
    with running(model, Rule(64, gather_s=0.2, lanes=2)) as queue:
        first = queue.submit(["x"], PLAIN, 10)
        model.await_calls(1)  # one lane holds "x"
        jobs = [queue.submit([f"s{i}"], PLAIN, 10) for i in range(9)]
        model.clock.advance(0.2)  # the free lane's window ends
        model.await_calls(2)
        assert model.taken == [1, 5] and queue.queued == 4
        model.gate.set()  # then the lanes share the 4 as they come free
        assert texts(first) == ["X"]
        assert [texts(job) for job in jobs] == [[f"S{i}"] for i in range(9)]
        decoded = sorted(line for lines, _ in model.calls for line in lines)
        assert decoded == sorted(["x", *(f"s{i}" for i in range(9))])  # each once


def test_a_lane_that_answered_waits_for_those_clients_to_come_back() -> None:
    """Closed-loop clients send their next sentence as soon as they have their answer:
    the lane that answered them takes them together instead of the first ones alone,
    and a client that does not come back costs the others the wait, at most the time
    the batch took."""
    clock = FakeClock()
    model = Model(clock, seconds=0.5)
    rule = Rule(10, gather_s=0.0, return_s=2.0, wait_share=1.0)  # waits up to 0.5 s
    with running(model, rule, start=False) as queue:
        first = [queue.submit([f"a{i}"], PLAIN, 10) for i in range(4)]
        again: list[Job] = []
        for i, job in enumerate(first[:3]):  # three are back at once, one later
            come_back(job, queue, f"b{i}", again)
        queue.start()
        clock.await_timed_waits(1)  # the lane waits for the fourth
        assert model.taken == [4] and queue.queued == 3
        again.append(queue.submit(["b3"], PLAIN, 10))
        assert [texts(job) for job in again] == [[f"B{i}"] for i in range(4)]
        assert model.taken == [4, 4]
        # a client alone: the lane waits for the three others, for the batch's 0.5 s
        alone = queue.submit(["c"], PLAIN, 10)
        clock.await_timed_waits(2)
        clock.advance(0.25)
        clock.await_timed_waits(3)  # not yet
        assert model.taken == [4, 4] and queue.queued == 1
        clock.advance(0.25)
        assert texts(alone) == ["C"]
        assert model.taken == [4, 4, 1] and model.starts[2] == alone.arrived + 0.5


def test_a_lane_whose_clients_are_all_back_decodes_at_once() -> None:
    """The return wait ends once as many sentences have come as the lane answered,
    counted from its answers: clients back before the lane looks are decoded then."""
    clock = FakeClock()
    model = Model(clock, seconds=0.5)
    rule = Rule(10, gather_s=0.0, return_s=2.0, wait_share=1.0)
    with running(model, rule, start=False) as queue:
        first = [queue.submit([f"a{i}"], PLAIN, 10) for i in range(4)]
        again: list[Job] = []
        for i, job in enumerate(first):
            come_back(job, queue, f"b{i}", again)
        queue.start()
        model.await_calls(2)
        assert [texts(job) for job in again] == [[f"B{i}"] for i in range(4)]
        assert model.taken == [4, 4] and clock.timed_waits == 0
        assert model.starts == [1000.0, 1000.5]  # the second batch started as the first ended


def test_a_lane_whose_last_batch_took_no_time_does_not_wait() -> None:
    """A batch that took no time earns no wait: a client back at once is decoded alone,
    and the ones after it are the next batch."""
    model = Model(FakeClock(), seconds=0.0)
    rule = Rule(10, gather_s=0.0, return_s=2.0)
    with running(model, rule, start=False) as queue:
        first = [queue.submit([f"a{i}"], PLAIN, 10) for i in range(4)]
        again: list[Job] = []

        def three_more(_: object) -> None:  # clients that came once "b0" was answered
            again.extend(queue.submit([f"b{i}"], PLAIN, 10) for i in range(1, 4))

        def one_back(_: object) -> None:
            again.append(queue.submit(["b0"], PLAIN, 10))
            again[0].future.add_done_callback(three_more)

        first[0].future.add_done_callback(one_back)
        queue.start()
        model.await_calls(3)
        assert [texts(job) for job in again] == [[f"B{i}"] for i in range(4)]
        assert model.taken == [4, 1, 3] and model.clock.timed_waits == 0


def test_the_gather_window_holds_a_request_only_while_another_lane_decodes() -> None:
    """With every lane idle a request is decoded at once (a gather window would only delay
    a lone client); while one lane decodes, a free lane with no batch behind it gathers
    for the whole window."""
    clock = FakeClock()
    model = Model(clock)
    model.gate.clear()
    with running(model, Rule(10, gather_s=0.5, lanes=2)) as queue:
        first = queue.submit(["a"], PLAIN, 10)
        model.await_calls(1)
        assert model.starts == [first.arrived]  # at once
        second = queue.submit(["b"], PLAIN, 10)
        clock.await_timed_waits(1)  # "b" is gathering
        clock.advance(0.25)
        clock.await_timed_waits(2)
        assert model.taken == [1]
        clock.advance(0.25)
        model.await_calls(2)
        assert model.starts[1] == second.arrived + 0.5
        model.gate.set()
        assert texts(first) == ["A"] and texts(second) == ["B"]


def test_the_gather_window_is_bounded_by_the_lanes_last_batch() -> None:
    """After a batch that took no time, a lane does not gather at all, even while the
    other lane decodes."""
    clock = FakeClock()
    model = Model(clock)
    model.gate.clear()
    with running(model, Rule(10, gather_s=0.5, lanes=2), start=False) as queue:
        warm = [queue.submit([f"w{i}"], PLAIN, 10) for i in range(2)]
        clock.advance(1)  # past their window: a lane each
        queue.start()
        model.await_calls(2)
        model.gate.set()  # both lanes' last batches: no time
        assert [texts(job) for job in warm] == [["W0"], ["W1"]]
        model.gate.clear()
        held = queue.submit(["a"], PLAIN, 10)  # all idle: one lane takes it at once
        model.await_calls(3)
        late = queue.submit(["b"], PLAIN, 10)  # the other lane, its last batch quick
        model.await_calls(4)
        assert clock.timed_waits == 0 and model.starts[3] == late.arrived
        model.gate.set()
        assert texts(held) == ["A"] and texts(late) == ["B"]
        assert model.taken == [1, 1, 1, 1]
