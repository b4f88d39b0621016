"""Batching across requests: one queue per model, and its decoding lanes.

A request's sentences go on the model's queue as one `Job` with its decoding options, its
deadline and a future. A lane (a thread; one per worker process of the model) that has
just answered n sentences waits up to `return_s` for n more to have come since (the
clients it answered send their next ones within milliseconds; without the wait those
queued for the next free lane: at 64 closed-loop clients a third of them always waited,
and the lanes decoded batches of 21 instead of 31). Any other lane takes the first job
and waits up to `gather_s` for more (or until `max_batch` sentences wait) while another
lane is decoding (with every lane idle the load is light, and it takes the job at once).
Neither wait takes longer than 3% of the time the lane's last batch took to decode. It
then takes jobs in arrival order up to its share (an even split among all lanes of what
waits and what the other lanes are decoding, at most `max_batch`), and decodes those that
share options together: one call of `decode` with all their sentences, which sorts them by
length into a batch as `nmt translate` does. Each job's future then gets its own results,
in its own order. The lanes work side by side: while one lane's batch decodes on one
core, the next requests gather for the next free lane, so under load every core decodes a
batch of about an even share of the clients, with no lane waiting for another's
straggler. (A lane that took everything that waited, while another was about to finish a
small batch, kept one lane on large batches and the other cycling through small ones for
as long as the load lasted: at 64 clients, batches of 52 beside batches of 12.) The event
loop never decodes: it only puts jobs on the queue and awaits their futures.

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
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
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
    deadline: float  # time.monotonic() after which its answer is no longer wanted
    arrived: float = field(default_factory=time.monotonic)
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
# batch where decoding is slow per sentence (fp32: ~1 s batches, 30 ms), but not where it
# is fast (bf16: batches of ~0.3 s, whose size matters less, where a flat 30 ms left the
# workers idle 10% of the time at 64 clients).
WAIT_SHARE = 0.03


class Batcher:
    """A model's queue and the thread that decodes it (see the module's docstring)."""

    def __init__(
        self,
        pair: str,
        decode: Decode,
        metrics: Metrics,
        queue_sentences: int,
        max_batch: int,
        gather_s: float,
        lanes: int = 1,
        return_s: float = 0.0,
        wait_share: float = WAIT_SHARE,
    ) -> None:
        self.pair, self.decode, self.metrics = pair, decode, metrics
        self.limit, self.max_batch, self.gather_s = queue_sentences, max_batch, gather_s
        self.return_s, self.wait_share = return_s, wait_share
        self._jobs: deque[Job] = deque()
        self._queued = 0  # sentences in _jobs
        self._arrived = 0  # sentences ever queued
        self._decoding = 0  # sentences the lanes took and have not answered yet
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, name=f"nmt-serve-{pair}-{i}", daemon=True)
            for i in range(max(1, lanes))
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
        until = time.monotonic() + wait_s
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
            job = Job(sentences, options, time.monotonic() + timeout_s)
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
        answered = 0  # sentences of this lane's last batch: their clients may send more
        mark = 0  # sentences ever queued when this lane answered that batch
        took_s: float | None = None  # how long that batch took to decode
        while (jobs := self._take(answered, mark, took_s)) is not None:
            answered = sum(len(job.sentences) for job in jobs)
            groups: dict[Options, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.options, []).append(job)
            started = time.monotonic()
            try:
                answers = [a for opts, group in groups.items() for a in self._decode(opts, group)]
            finally:
                self._count_decoding(-answered)
            took_s = time.monotonic() - started
            with self._cond:  # before any of its clients can have sent again
                mark = self._arrived
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

    def _take(self, answered: int, mark: int, took_s: float | None) -> list[Job] | None:
        """A lane's next jobs (possibly none: they had expired, or other free lanes took
        them); None: stop."""
        with self._cond:
            taken, expired = self._gather(answered, mark, took_s)
        for job in expired:
            if job.future.set_running_or_notify_cancel():  # False: its client cancelled it
                job.future.set_exception(DeadlineExceeded())
            self.metrics.dropped(self.pair, "timeout", len(job.sentences))
        return taken

    def _gather(
        self, answered: int, mark: int, took_s: float | None
    ) -> tuple[list[Job] | None, list[Job]]:
        """Under the lock, as a free lane: wait for work, then for the clients it answered
        (or the gather window), then take this lane's share in arrival order; also the
        jobs found past their deadline."""
        while not self._jobs and not self._stopping:
            self._cond.wait()
        if self._stopping:
            return None, []
        # Neither wait costs more than a small share of what the lane's last batch took.
        cap = math.inf if took_s is None else self.wait_share * took_s
        wait_s = min(self.return_s, cap)
        if answered and wait_s > 0:
            # The clients this lane just answered are sending their next sentences: wait
            # until as many sentences have come since it answered (or a full batch
            # waits), or they queue until the next lane frees. This takes the place of
            # the gather window, which held the batch a fixed time after the first of
            # them came (64 clients: all back ~9 ms after the answers, the window ending
            # at ~11 ms). Counted from the answers, not from now: that counted the
            # returned clients twice and always waited the whole wait (24 ms a batch).
            want = mark + answered
            self._wait_while(
                lambda: self._arrived < want and self._queued < self.max_batch,
                time.monotonic() + wait_s,
            )
        else:
            # With no lane decoding, the load is light: a gather window would only hold
            # the request back (a lone client's sentence by the whole window), and what
            # arrives next goes to the other lanes or queues behind this batch.
            gather_s = min(self.gather_s, cap) if self._decoding else 0.0
            gathered = self._jobs[0].arrived + gather_s
            self._wait_while(lambda: bool(self._jobs) and self._queued < self.max_batch, gathered)
        # An even share of all the work there is, waiting and being decoded, for every
        # lane: a lane that took everything that waited while the other was nearly done
        # would keep a large batch, the other small ones, for as long as the load lasts.
        share = math.ceil((self._queued + self._decoding) / len(self._threads))
        share = min(self.max_batch, share)
        now, sentences = time.monotonic(), 0
        taken: list[Job] = []
        expired: list[Job] = []
        while self._jobs:
            job = self._jobs[0]
            if taken and sentences + len(job.sentences) > share:
                break
            self._jobs.popleft()
            self._queued -= len(job.sentences)
            if job.deadline <= now:
                expired.append(job)
            elif job.future.set_running_or_notify_cancel():  # False: cancelled
                taken.append(job)
                sentences += len(job.sentences)
        self._count_decoding(sentences)  # the condition's lock is reentrant
        return taken, expired

    def _wait_while(self, condition: Callable[[], bool], until: float) -> None:
        """Under the lock: wait for changes while `condition` holds, until `until`
        (time.monotonic()) or a stop."""
        while condition() and not self._stopping:
            left = until - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

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
