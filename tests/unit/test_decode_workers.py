"""The decoding worker pool: results in order from forked processes, and a clear error
when a worker dies (as the kernel's out-of-memory killer would make it)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from nmt_cli.core.search import Hypothesis
from nmt_cli.engines.translate.workers import DecodePool, forks
from nmt_cli.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")  # workers are processes at one thread


class Echo:
    """Stands in for a Translator (a workers.RowDecoder): 'decodes' each row into its own
    tokens, and reports which process did it."""

    def decode_rows(self, rows: list[list[int]], attention: bool = False) -> list[list[Hypothesis]]:
        return [[Hypothesis(row, float(os.getpid()), float(attention))] for row in rows]


class Dies:
    def decode_rows(self, rows: list[list[int]], attention: bool = False) -> list[list[Hypothesis]]:
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
