"""A request's side of batching: queue its sentences, then wait for the first of three
things: its results, its deadline, or its client leaving.

A client that closes its connection while its sentences wait is noticed at once (the
server reports `http.disconnect`), and its job is taken off the queue, so it costs no
decoding. Past the deadline the job is taken off the same way and the request answered
504. A job already being decoded finishes with its batch (a batch cannot be cut short),
and its results are dropped.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.types import Receive

from nmt_cli.engines.serve.batcher import DeadlineExceeded, Options

if TYPE_CHECKING:
    from nmt_cli.engines.serve.service import Model
    from nmt_cli.engines.translate.translator import Translation


class ClientLeft(Exception):
    """The client closed its connection before its answer was ready."""


async def translate(
    model: Model, sentences: list[str], options: Options, timeout_s: float, receive: Receive
) -> list[Translation]:
    """`sentences` translated by `model`'s decoding thread, in their order. Raises
    QueueFull or Stopping (nothing queued), DeadlineExceeded, ClientLeft, or the decoding's
    own failure."""
    job = model.batcher.submit(sentences, options, timeout_s)
    result = asyncio.wrap_future(job.future)
    left = asyncio.ensure_future(_disconnect(receive))
    either: set[asyncio.Future[Any]] = {result, left}
    try:
        done, _ = await asyncio.wait(either, timeout=timeout_s, return_when="FIRST_COMPLETED")
    except asyncio.CancelledError:  # the server is stopping and gave up waiting
        model.batcher.withdraw(job, "stopping")
        raise
    finally:
        left.cancel()
    if result in done:
        return result.result()
    gone = left in done
    model.batcher.withdraw(job, "disconnected" if gone else "timeout")
    result.cancel()
    raise ClientLeft() if gone else DeadlineExceeded()


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
