"""The decoding worker pool: results in order from forked processes, and a clear error
when a worker dies (as the kernel's out-of-memory killer would make it)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

from nmt_cli.core.search import Hypothesis
from nmt_cli.engines.translate.workers import DecodePool, forks
from nmt_cli.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")  # workers are processes at one thread


class Echo:
    """Stands in for a Translator (a workers.RowDecoder): 'decodes' each row into its own
    tokens, and reports which process did it."""

    def decode_rows(
        self, rows: list[list[int]], attention: bool = False, needs: object = None
    ) -> list[list[Hypothesis]]:
        return [[Hypothesis(row, float(os.getpid()), float(attention))] for row in rows]


class Dies:
    def decode_rows(
        self, rows: list[list[int]], attention: bool = False, needs: object = None
    ) -> list[list[Hypothesis]]:
        os._exit(9)


def test_batches_come_back_in_order_from_the_workers() -> None:
    pool = DecodePool(Echo(), 2)
    try:
        batches = [[[i, i + 1]] for i in range(12)]
        decoded = pool.map(batches, attention=True)
    finally:
        pool.close()
    assert [d[0][0].tokens for d in decoded] == [b[0] for b in batches]
    assert all(d[0][0].log_prob == 1.0 for d in decoded)
    decoded_in = {int(d[0][0].score) for d in decoded}
    assert (os.getpid() not in decoded_in) == forks() == pool.processes
    assert forks() == sys.platform.startswith("linux")


def test_several_threads_per_worker_mean_threads_not_processes() -> None:
    torch.set_num_threads(2)  # the one_thread fixture restores the count
    assert not forks()


def test_a_worker_that_dies_is_a_clear_error() -> None:
    if not forks():
        pytest.skip("worker processes only where the system forks")
    pool = DecodePool(Dies(), 2)
    try:
        with pytest.raises(NmtError, match="decoding worker process died"):
            pool.map([[[1]], [[2]]], attention=False)
    finally:
        pool.close()


class FailsOnZero:
    """Raises on a batch whose first token is 0 (as a decoding bug would); echoes others."""

    def decode_rows(
        self, rows: list[list[int]], attention: bool = False, needs: object = None
    ) -> list[list[Hypothesis]]:
        if rows[0][0] == 0:
            raise ValueError("cannot decode token 0")
        return Echo().decode_rows(rows, attention)


class Slow:
    """Takes `rows[0][0]` tenths of a second, then dies if the first token is 9."""

    def decode_rows(
        self, rows: list[list[int]], attention: bool = False, needs: object = None
    ) -> list[list[Hypothesis]]:
        time.sleep(rows[0][0] / 10)
        if rows[0][0] == 9:
            os._exit(9)
        return Echo().decode_rows(rows, attention)


def processes_only() -> None:
    if not forks():
        pytest.skip("worker processes only where the system forks")


def test_a_batch_that_fails_raises_its_error_and_the_workers_go_on() -> None:
    pool = DecodePool(FailsOnZero(), 2)
    try:
        with pytest.raises(ValueError, match="cannot decode token 0"):
            pool.map([[[1]], [[0]], [[2]], [[3]]], attention=False)
        decoded = pool.map([[[i]] for i in range(1, 9)], attention=False)
    finally:
        pool.close()
    assert [d[0][0].tokens for d in decoded] == [[i] for i in range(1, 9)]
    if pool.processes:  # both workers still decode
        assert len({d[0][0].score for d in decoded}) == 2


def test_threads_that_share_the_pool_each_get_their_own_batches() -> None:
    pool = DecodePool(Echo(), 2)
    results: dict[int, list[list[int]]] = {}

    def lane(k: int) -> None:
        batches = [[[k, i]] for i in range(20)]
        results[k] = [d[0][0].tokens for d in pool.map(batches, attention=False)]

    try:
        lanes = [threading.Thread(target=lane, args=(k,)) for k in range(4)]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            thread.join(30)
    finally:
        pool.close()
    assert results == {k: [[k, i] for i in range(20)] for k in range(4)}


def call_in_thread(
    pool: DecodePool, rows: list[list[int]], errors: list[NmtError]
) -> threading.Thread:
    """`pool.map([rows])` started in a thread of its own; its NmtError goes to `errors`."""

    def call() -> None:
        try:
            pool.map([rows], attention=False)
        except NmtError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_a_call_waiting_for_a_free_worker_fails_too_when_the_worker_dies() -> None:
    processes_only()
    pool = DecodePool(Slow(), 1)
    errors: list[NmtError] = []
    try:
        first = call_in_thread(pool, [[9]], errors)  # holds the worker, then dies
        time.sleep(0.2)
        second = call_in_thread(pool, [[1]], errors)  # waits for a free worker
        first.join(30)
        second.join(30)
        assert not first.is_alive() and not second.is_alive()
    finally:
        pool.close()
    assert len(errors) == 2
    assert all("decoding worker process died" in str(e) for e in errors)


def test_closing_without_waiting_ends_a_busy_worker() -> None:
    processes_only()
    pool = DecodePool(Slow(), 1)
    errors: list[NmtError] = []
    caller = call_in_thread(pool, [[600]], errors)  # a minute's batch
    time.sleep(0.3)
    started = time.monotonic()
    pool.close(wait=False)
    caller.join(30)
    assert time.monotonic() - started < 10
    assert not caller.is_alive() and len(errors) == 1
