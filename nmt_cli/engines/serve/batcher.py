"""Batching across requests: one queue per model, and its decoding lanes.

A request's sentences go on the model's queue as one `Job` with its decoding options, its
deadline and a future. A lane (a thread; one per worker process of the model) takes the
next batch from the queue, decodes it and answers each job; the event loop never decodes:
it only puts jobs on the queue and awaits their futures.

When a lane goes, and what it takes, is the batching rule: the pure functions below
(`plan_wait`, `wait_left`, `lane_share`, `take`) of the queue's counts and of clock
readings, so that the rule can be checked case by case, without threads or time, and the
lanes only apply it. A lane that has just answered n sentences waits up to `return_s` for
n more to have come since: the clients it answered send their next sentences within
milliseconds, and without the wait those would queue for the next free lane. Any other
lane waits up to `gather_s` after the first job came (or until `max_batch` sentences
wait), but only while another lane is decoding: with every lane idle the load is light,
and a window would only hold a lone request back. Neither wait lasts longer than a small
share of the time the lane's last batch took, where waiting for a fuller batch costs more
than it brings. The lane then takes jobs in arrival order up to its share (an even split
among all lanes of what waits and what the other lanes are decoding, at most
`max_batch`): a lane that took everything that waited while the other was about to finish
a small batch would keep one lane on large batches and the other on small ones for as
long as the load lasted. Jobs that share options decode together: one call of `decode`
with all their sentences, which sorts them by length into a batch as `nmt translate`
does, and each job's future gets its own results, in its own order. While one lane's
batch decodes on one core, the next requests gather for the next free lane, so under load
every core decodes a batch of about an even share of the clients, with no lane waiting
for another's straggler.

Memory stays bounded: the queue holds at most `queue_sentences` sentences (a request that
would pass it is refused with `QueueFull` at once, never parked), a job whose deadline has
passed when it is taken is answered `DeadlineExceeded` undecoded, and a job its client
gave up on is taken off the queue (`withdraw`) before it costs any decoding.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from nmt_cli.engines.serve.metrics import Metrics

if TYPE_CHECKING:
    from nmt_cli.engines.translate.translator import Translation

    # A job's future and what it is to be set to: its results, or the decoding's failure.
    Answer = tuple[Future[list[Translation]], list[Translation] | Exception]


@dataclass(frozen=True)
class Options:
    """The decoding choices a request may make; jobs that share them decode together."""

    beam: int
    nbest: int
    alignment: bool = False
    attention: bool = False


@dataclass(eq=False)
class Job:
    sentences: list[str]
    options: Options
    deadline: float  # the lanes' clock reading after which its answer is no longer wanted
    arrived: float  # the lanes' clock reading when it was queued
    future: Future[list[Translation]] = field(default_factory=Future)


class QueueFull(Exception):
    """The queue cannot take a request's sentences now; the client should retry later."""


class DeadlineExceeded(Exception):
    """A job's deadline passed before its decoding started; it was dropped."""


class Stopping(Exception):
    """The server is stopping and decodes no new work."""


Decode = Callable[[list[str], Options], "list[Translation]"]

# A lane gathers, and waits for the clients it answered, at most this share of its last
# batch's decoding time (and at most `gather_s`, `return_s`): waiting is worth a fuller
# batch where decoding is slow per sentence, but where it is fast a flat wait leaves the
# workers idle for a batch whose size matters less.
WAIT_SHARE = 0.03


# --- the batching rule: pure functions of the queue's counts and clock readings ---------


@dataclass(frozen=True)
class Rule:
    """How a model's lanes batch: at most `max_batch` sentences a batch, a gather window
    of `gather_s`, a wait of `return_s` for the clients a lane answered, neither longer
    than `wait_share` of the lane's last batch's decoding time; `lanes` lanes."""

    max_batch: int
    gather_s: float
    return_s: float = 0.0
    wait_share: float = WAIT_SHARE
    lanes: int = 1

    def __post_init__(self) -> None:
        if self.lanes < 1 or self.max_batch < 1:
            raise ValueError(f"a batcher needs a lane and a batch: {self}")


@dataclass(frozen=True)
class Backlog:
    """The queue's counts as a lane reads them under the lock."""

    jobs: int  # jobs waiting
    queued: int  # their sentences
    arrived: int  # sentences ever queued
    decoding: int  # sentences the lanes took and have not answered yet


@dataclass(frozen=True)
class LastBatch:
    """What a lane knows of the batch it answered last (none yet: the defaults)."""

    answered: int = 0  # its sentences: their clients may be sending their next ones
    mark: int = 0  # sentences ever queued when the lane answered them
    took_s: float | None = None  # how long it took to decode


@dataclass(frozen=True)
class Wait:
    """A lane's wait, fixed when it finds work: it ends at `until` (a clock reading), or
    sooner once a full batch waits, and once `want` sentences have ever been queued (the
    return wait) or, for a gather window (`want` None), once the queue is empty."""

    until: float
    want: int | None = None


@dataclass(frozen=True)
class Waiting:
    """A queued job as the rule sees it."""

    sentences: int
    deadline: float
    cancelled: bool = False


class Fate(Enum):
    """What becomes of a job a lane takes off the queue."""

    DECODE = "decode"
    EXPIRED = "expired"  # its deadline passed: answered DeadlineExceeded
    CANCELLED = "cancelled"  # its client cancelled it: nothing to answer


def plan_wait(rule: Rule, last: LastBatch, backlog: Backlog, first: float, now: float) -> Wait:
    """The wait of a lane that has just found work (`first`: when the oldest job came)."""
    cap = math.inf if last.took_s is None else rule.wait_share * last.took_s
    return_s = min(rule.return_s, cap)
    if last.answered and return_s > 0:
        # Counted from the answers, not from now: the clients already back when the lane
        # looks are among the n, and counting them again would make it wait to the end.
        # Knowing how many to expect, it needs no gather window.
        return Wait(now + return_s, last.mark + last.answered)
    # With no lane decoding, the load is light: a window would only hold the request back
    # (a lone client's sentence by the whole window), and what arrives next goes to the
    # other lanes or queues behind this batch.
    gather_s = min(rule.gather_s, cap) if backlog.decoding else 0.0
    return Wait(first + gather_s, None)


def wait_left(rule: Rule, wait: Wait, backlog: Backlog, now: float) -> float:
    """Seconds the lane goes on waiting for the queue to change; 0.0: take a share now."""
    back = wait.want is not None and backlog.arrived >= wait.want
    gone = wait.want is None and not backlog.jobs  # withdrawn: nothing left to gather for
    if back or gone or backlog.queued >= rule.max_batch or now >= wait.until:
        return 0.0
    return wait.until - now


def lane_share(rule: Rule, backlog: Backlog) -> int:
    """The sentences a lane takes at most: an even share for every lane of all the work
    there is, waiting and being decoded, and at most a full batch."""
    return min(rule.max_batch, math.ceil((backlog.queued + backlog.decoding) / rule.lanes))


def take(queue: Iterable[Waiting], share: int, now: float) -> list[Fate]:
    """The fates of the jobs that leave the queue, from its head, for a lane's batch of at
    most `share` sentences: jobs in arrival order while they fit (the first job to decode
    goes however large: a request is never split); a job past its deadline at `now`, or
    cancelled, leaves the queue without counting. Reads `queue` only as far as it takes."""
    fates: list[Fate] = []
    decoded = sentences = 0
    for job in queue:
        if decoded and sentences + job.sentences > share:
            break
        if job.deadline <= now:
            fates.append(Fate.EXPIRED)
        elif job.cancelled:
            fates.append(Fate.CANCELLED)
        else:
            fates.append(Fate.DECODE)
            decoded, sentences = decoded + 1, sentences + job.sentences
    return fates


# --- the queue and its lanes --------------------------------------------------------------


class Clock:
    """The lanes' time: `now()` in seconds, and `wait`, which releases the queue's lock
    until the queue changes or `timeout` seconds pass (None: until it changes). One
    object, so that a test can give the lanes a time that moves only when it says."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(timeout)


MONOTONIC = Clock()


class Batcher:
    """A model's queue and the lanes that decode it (see the module's docstring)."""

    def __init__(
        self,
        pair: str,
        decode: Decode,
        metrics: Metrics,
        queue_sentences: int,
        rule: Rule,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.pair, self.decode, self.metrics = pair, decode, metrics
        self.limit, self.rule, self.clock = queue_sentences, rule, clock
        self._jobs: deque[Job] = deque()
        self._queued = 0  # sentences in _jobs
        self._arrived = 0  # sentences ever queued
        self._decoding = 0  # sentences the lanes took and have not answered yet
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, name=f"nmt-serve-{pair}-{i}", daemon=True)
            for i in range(rule.lanes)
        ]

    @property
    def queued(self) -> int:
        """Sentences waiting now."""
        with self._cond:
            return self._queued

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, wait_s: float) -> bool:
        """Decode nothing new; jobs still queued get `Stopping`. Waits up to `wait_s` for
        the batches being decoded; returns whether every lane ended."""
        with self._cond:
            self._stopping = True
            left = list(self._jobs)
            self._jobs.clear()
            self._queued = 0
            self._cond.notify_all()
        for job in left:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(Stopping())
            self.metrics.dropped(self.pair, "stopping", len(job.sentences))
        until = time.monotonic() + wait_s  # real time: it bounds the threads' joins
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, until - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def submit(self, sentences: list[str], options: Options, timeout_s: float) -> Job:
        """Queue `sentences`; raises QueueFull (nothing queued) or Stopping."""
        with self._cond:
            if self._stopping:
                raise Stopping()
            if self._queued + len(sentences) > self.limit:
                raise QueueFull()
            now = self.clock.now()
            job = Job(sentences, options, now + timeout_s, now)
            self._jobs.append(job)
            self._queued += len(sentences)
            self._arrived += len(sentences)
            self._cond.notify_all()
        return job

    def withdraw(self, job: Job, reason: str) -> bool:
        """Take `job` off the queue if its decoding has not started; returns whether it
        was still queued (then it costs nothing more)."""
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            self._queued -= len(job.sentences)
        job.future.cancel()
        self.metrics.dropped(self.pair, reason, len(job.sentences))
        return True

    def _run(self) -> None:
        last = LastBatch()
        while (jobs := self._take(last)) is not None:
            answered = sum(len(job.sentences) for job in jobs)
            groups: dict[Options, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.options, []).append(job)
            started = self.clock.now()
            try:
                answers = [a for opts, group in groups.items() for a in self._decode(opts, group)]
            finally:
                self._count_decoding(-answered)
            took_s = self.clock.now() - started
            with self._cond:  # before any of its clients can have sent again
                last = LastBatch(answered, self._arrived, took_s)
            for future, outcome in answers:
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _count_decoding(self, change: int) -> None:
        """Sentences taken by the lanes and not answered yet: the lanes' shares and the
        /metrics gauge are one count."""
        with self._cond:
            self._decoding += change
            self.metrics.decoding(self.pair, change)

    def _take(self, last: LastBatch) -> list[Job] | None:
        """A lane's next jobs (possibly none: they had expired, or other free lanes took
        them); None: stop."""
        with self._cond:
            taken, expired = self._gather(last)
        for job in expired:
            if job.future.set_running_or_notify_cancel():  # False: its client cancelled it
                job.future.set_exception(DeadlineExceeded())
            self.metrics.dropped(self.pair, "timeout", len(job.sentences))
        return taken

    def _backlog(self) -> Backlog:
        return Backlog(len(self._jobs), self._queued, self._arrived, self._decoding)

    def _gather(self, last: LastBatch) -> tuple[list[Job] | None, list[Job]]:
        """Under the lock, as a free lane: wait for work, then as the rule says, then take
        this lane's share; also the jobs found past their deadline."""
        while not self._jobs and not self._stopping:
            self.clock.wait(self._cond, None)
        if self._stopping:
            return None, []
        wait = plan_wait(self.rule, last, self._backlog(), self._jobs[0].arrived, self.clock.now())
        while not self._stopping:
            left = wait_left(self.rule, wait, self._backlog(), self.clock.now())
            if left <= 0:
                break
            self.clock.wait(self._cond, left)
        fates = take(
            (Waiting(len(j.sentences), j.deadline, j.future.cancelled()) for j in self._jobs),
            lane_share(self.rule, self._backlog()),
            self.clock.now(),
        )
        taken: list[Job] = []
        expired: list[Job] = []
        for fate in fates:
            job = self._jobs.popleft()
            self._queued -= len(job.sentences)
            if fate is Fate.EXPIRED:
                expired.append(job)
            elif fate is Fate.DECODE and job.future.set_running_or_notify_cancel():
                taken.append(job)
        self._count_decoding(sum(len(job.sentences) for job in taken))  # a reentrant lock
        return taken, expired

    def _decode(self, options: Options, jobs: list[Job]) -> list[Answer]:
        """Each job's future and what it is to get: its own results, or the decoding's
        failure (the requests fail with 500; the server goes on)."""
        lines = [sentence for job in jobs for sentence in job.sentences]
        try:
            results = self.decode(lines, options)
        except Exception as exc:
            return [(job.future, exc) for job in jobs]
        tokens = sum(r.hypotheses[0].length for r in results if r.hypotheses)
        self.metrics.decoded(self.pair, len(lines), tokens)
        answers: list[Answer] = []
        start = 0
        for job in jobs:
            answers.append((job.future, results[start : start + len(job.sentences)]))
            start += len(job.sentences)
        return answers
