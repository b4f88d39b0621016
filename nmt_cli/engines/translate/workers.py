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
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import repeat
from typing import Protocol

import torch

from nmt_cli.core.search import Hypothesis
from nmt_cli.cpu_decode.memory import Releaser
from nmt_cli.errors import NmtError

Rows = list[list[int]]  # one batch: the source token ids of its sentences
Decoded = list[list[Hypothesis]]  # per sentence of a batch, its hypotheses


class RowDecoder(Protocol):
    """What the workers decode with: a Translator (translator.py), which makes the pool."""

    def decode_rows(self, rows: Rows, attention: bool = False) -> Decoded: ...


class _Worker:
    """What a worker process decodes with: the translator it was forked with."""

    translator: RowDecoder | None = None
    releaser: Releaser | None = None


def _adopt(translator: RowDecoder) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _Worker.translator, _Worker.releaser = translator, Releaser()


def _decode(rows: Rows, attention: bool) -> Decoded:
    assert _Worker.translator is not None and _Worker.releaser is not None
    decoded = _Worker.translator.decode_rows(rows, attention)
    _Worker.releaser.after_chunk()
    return decoded


def forks() -> bool:
    """Whether batches are decoded in forked processes here (Linux, one thread per
    worker: see above) rather than threads."""
    linux = sys.platform.startswith("linux")
    return (
        linux
        and "fork" in multiprocessing.get_all_start_methods()
        and (torch.get_num_threads() == 1)
    )


class DecodePool:
    """`workers` batches decoded at once for one translator, for the translator's life.

    (One pool, not one per chunk: a thread pool per chunk made glibc give each new thread
    its own malloc arena, and resident memory grew with the input.)"""

    def __init__(self, translator: RowDecoder, workers: int) -> None:
        self.translator = translator
        self.processes = forks()
        self.executor: Executor
        if self.processes:
            self.executor = ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_adopt,
                initargs=(translator,),
            )
        else:
            self.executor = ThreadPoolExecutor(workers, thread_name_prefix="nmt-decode")
        # Stops the workers when the translator goes away without being closed.
        self._finalizer = weakref.finalize(
            self, self.executor.shutdown, wait=False, cancel_futures=True
        )

    def map(self, batches: Sequence[Rows], attention: bool) -> list[Decoded]:
        """Each batch's hypotheses, in the order of `batches`."""
        decode = _decode if self.processes else self.translator.decode_rows
        try:
            return list(self.executor.map(decode, batches, repeat(attention)))
        except BrokenProcessPool:
            raise NmtError(
                "a decoding worker process died (out of memory?); try --workers 1 or a "
                "smaller --batch-size"
            ) from None

    def close(self, wait: bool = True) -> None:
        """Stop the workers. `wait` (after a clean finish: they are idle) lets them exit
        before returning; not waiting, the interpreter could exit while the executor's
        manager thread still shut down, and Python 3.11 then printed an ignored
        "Bad file descriptor" traceback at exit. After an interruption the caller does
        not wait for the batches the workers are in."""
        self._finalizer.detach()
        self.executor.shutdown(wait=wait, cancel_futures=True)
