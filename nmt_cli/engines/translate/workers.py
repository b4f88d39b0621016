"""Batches decoded side by side on a CPU: one worker process per core where the system
can fork, one thread each otherwise.

A decoder step is hundreds of small PyTorch operations, and between them Python holds
its interpreter lock. Two threads decoding side by side take turns at that lock on
every operation: on the 2-core benchmark machine, two threads decoding one sentence at
a time were no faster than one thread, while two processes are 1.9x (BENCHMARKS.md).

The workers are forked from the process that built the model, when it first has more
than one batch to decode: they share the model's memory copy-on-write (nothing is loaded
or pickled), start in milliseconds, and only token ids travel to them and hypotheses
back. A worker ignores Ctrl-C (the parent stops them), uses one thread, and hands freed
heap pages back to the system as the parent does. Where fork is not the platform's way
(macOS, Windows), threads decode instead, and so they do when each worker is to use
several threads (`--threads` above `--workers`): GNU OpenMP, which PyTorch's CPU builds
use, cannot start a team of threads in a process forked from one that had a team.

Each worker has a pipe of its own, and the thread that has a batch to decode takes a free
worker, writes the batch to its pipe and reads the answer from it. (A
`ProcessPoolExecutor` passes each call through its manager thread and its queue's feeder
thread, and back through the manager: at batch 1, as a server decodes a lone client's
sentence, those hand-offs took 1.0 ms of a 12 ms sentence, the pipe's 0.5 ms.)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import signal
import sys
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from multiprocessing.connection import Connection, wait
from typing import Protocol, cast

import torch

from nmt_cli.core.search import Hypothesis
from nmt_cli.engines.translate.forced import ForcedIds
from nmt_cli.errors import NmtError
from nmt_cli.heap import Releaser
from nmt_cli.trees.constraint import Leaves

Rows = list[list[int]]  # one batch: the source token ids of its sentences
Decoded = list[list[Hypothesis]]  # per sentence of a batch, its hypotheses
# per sentence of a batch, what constrains its output: a parse tree's leaves (each word's
# target pieces), or a translation's forced prefix and phrases; None: nothing
Needs = Sequence[Leaves | ForcedIds] | None

WORKER_DIED = (
    "a decoding worker process died (out of memory?); try --workers 1 or a smaller --batch-size"
)


class RowDecoder(Protocol):
    """What the workers decode with: a Translator (translator.py), which makes the pool."""

    def decode_rows(self, rows: Rows, attention: bool = False, needs: Needs = None) -> Decoded: ...


def _serve(conn: Connection, translator: RowDecoder) -> None:
    """A worker process's life: decode each batch its pipe brings, until told to stop
    (None) or the parent has gone. A batch that fails is answered with its exception, and
    the worker goes on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    releaser = Releaser()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        rows, attention, needs = request
        try:
            answer: tuple[bool, object] = (True, translator.decode_rows(rows, attention, needs))
        except Exception as exc:  # the parent raises it; this worker stays usable
            answer = (False, _sendable(exc))
        conn.send(answer)
        releaser.after_chunk()  # after the answer: the parent need not wait for it


def _sendable(exc: Exception) -> Exception:
    """`exc`, or where it cannot cross the pipe, a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def forks() -> bool:
    """Whether batches are decoded in forked processes here (Linux, one thread per
    worker: see above) rather than threads."""
    linux = sys.platform.startswith("linux")
    return (
        linux
        and "fork" in multiprocessing.get_all_start_methods()
        and (torch.get_num_threads() == 1)
    )


class _Worker:
    """One forked worker process and the parent's end of its pipe."""

    def __init__(self, translator: RowDecoder) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, translator), name="nmt-decode", daemon=True
        )
        self.process.start()
        child.close()

    def send(self, rows: Rows, attention: bool, needs: Needs) -> None:
        try:
            self.conn.send((rows, attention, needs))
        except OSError:  # the pipe broke: the worker is gone
            raise NmtError(WORKER_DIED) from None

    def receive(self) -> Decoded:
        try:
            ok, answer = self.conn.recv()
        except (EOFError, OSError):
            raise NmtError(WORKER_DIED) from None
        if not ok:
            assert isinstance(answer, BaseException)
            raise answer
        return answer

    def stop(self, wait: bool) -> None:
        """Ask an idle worker to exit and wait for it; otherwise (it may be mid-batch, or
        the caller is being interrupted) end it at once."""
        if wait and self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(5.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5.0)
        self.conn.close()


class DecodePool:
    """`workers` batches decoded at once for one translator, for the translator's life.
    Several threads may call `map` at once (a server's decoding lanes): each call decodes
    on the workers that are free, one batch a worker at a time.

    (One pool, not one per chunk: a thread pool per chunk made glibc give each new thread
    its own malloc arena, and resident memory grew with the input.)"""

    def __init__(self, translator: RowDecoder, workers: int) -> None:
        self.translator = translator
        self.processes = forks()
        self._workers: list[_Worker] = []
        self._free: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._threads: ThreadPoolExecutor | None = None
        if self.processes:
            self._workers = [_Worker(translator) for _ in range(workers)]
            for worker in self._workers:
                self._free.put(worker)
        else:
            self._threads = ThreadPoolExecutor(workers, thread_name_prefix="nmt-decode")
        self._failure: str | None = None  # why every call fails from now on
        # Stops the workers when the translator goes away without being closed.
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._threads)

    def map(
        self, batches: Sequence[Rows], attention: bool, needs: Sequence[Needs] | None = None
    ) -> list[Decoded]:
        """Each batch's hypotheses, in the order of `batches` (`needs`: each batch's). A
        batch that raised in its worker raises here, once the other batches being decoded
        are back."""
        wants = list(needs) if needs is not None else [None] * len(batches)
        if self._threads is not None:
            decode = self.translator.decode_rows
            return list(self._threads.map(decode, batches, repeat(attention), wants))
        if not batches:
            return []
        decoded: list[Decoded | None] = [None] * len(batches)
        todo = iter(enumerate(batches))
        free: list[_Worker] = []  # one worker at least, more where they are free now
        while len(free) < len(batches) and (worker := self._take(block=not free)) is not None:
            free.append(worker)
        busy: dict[Connection, tuple[_Worker, int]] = {}
        error: Exception | None = None
        try:
            while True:
                while free and error is None and (batch := next(todo, None)) is not None:
                    worker = free.pop()
                    worker.send(batch[1], attention, wants[batch[0]])
                    busy[worker.conn] = (worker, batch[0])
                if not busy:
                    break
                for conn in cast(list[Connection], wait(list(busy))):
                    worker, i = busy.pop(conn)
                    try:
                        decoded[i] = worker.receive()
                    except NmtError:
                        raise
                    except Exception as exc:  # the batch failed, its worker is fine
                        error = error or exc
                    free.append(worker)
        except NmtError:
            self._fail(WORKER_DIED)
            raise
        finally:
            # Only workers whose answers were read are handed on (after an interruption
            # the busy ones' next answer would reach the wrong call; close() ends them).
            for worker in free:
                self._free.put(worker)
        if error is not None:
            raise error
        return decoded  # type: ignore[return-value]

    def close(self, wait: bool = True) -> None:
        """Stop the workers: `wait` (after a clean finish: they are idle) lets each exit
        on its own; otherwise (after an interruption, mid-batch) they are ended."""
        self._finalizer.detach()
        self._fail("the translator was closed")
        _stop_all(self._workers, self._threads, wait)

    def _take(self, block: bool) -> _Worker | None:
        """A free worker (waiting for one if `block`), or None if none is free now."""
        if self._failure is not None:
            raise NmtError(self._failure)
        try:
            worker = self._free.get(block=block)
        except queue.Empty:
            return None
        if worker is None:  # the pool failed: wake the next waiter too
            self._free.put(None)
            raise NmtError(self._failure or WORKER_DIED)
        return worker

    def _fail(self, why: str) -> None:
        """Every call from now on fails with `why` (a worker died, or the pool was
        closed), and a call waiting for a free worker is woken to fail too."""
        if self._failure is None:
            self._failure = why
            self._free.put(None)


def _stop_all(
    workers: list[_Worker], threads: ThreadPoolExecutor | None, wait: bool = False
) -> None:
    for worker in workers:
        worker.stop(wait)
    if threads is not None:
        threads.shutdown(wait=wait, cancel_futures=True)
