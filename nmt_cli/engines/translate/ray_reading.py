"""A Ray dataset's output read in this process, with an end that leaves none of Ray Data's
threads running into a `ray.shutdown()`.

Ray Data reads a dataset in threads of its own: the streaming executor's scheduling loop
(which joins its metadata fetcher) and the workers that fetch each output block ahead of
the reader. When the reader stops early (an error in a caller's hands, Ctrl-C), Ray Data
tells them to stop but does not wait for them; one still fetching a block calls into Ray
after the driver has disconnected, and Ray then ends the whole process at once, exit
status 1, its only word a line in the driver's log ("The core worker has already been
shutdown ... The process will exit"; ray-project/ray#48808 is the same fault elsewhere
in Ray). That was the `--ray` command's Ctrl-C ending without its message, and the test
process that stopped a job ending silently.

So `read_blocks` ends the reading itself: it closes the iteration, which stops Ray
Data's fetching workers and then its executor (whose actors are killed), and it waits
for the threads of that reading to end before the caller may disconnect. It reads
without prefetching: Ray Data's prefetching thread would otherwise go on calling
into Ray on behalf of the workers, and the actors' work, not the fetch, is what takes
the time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

# The names Ray Data (the pinned 2.60) gives the threads of one reading that call into
# Ray: its streaming executor ("StreamingExecutor-<dataset>"), the executor's metadata
# fetcher and the workers that fetch output blocks. Its prefetching thread
# ("Prefetcher") only waits when nothing is prefetched, and is never joined.
READER_THREADS = ("StreamingExecutor-", "ray-data-metadata-prefetch", "iter_threaded")


def reader_threads(
    since: set[threading.Thread] | frozenset[threading.Thread] = frozenset(),
) -> list[threading.Thread]:
    """The live threads of Ray Data readings, but for those in `since`."""
    return [
        t for t in threading.enumerate() if t.name.startswith(READER_THREADS) and t not in since
    ]


@contextlib.contextmanager
def read_blocks(dataset: Any) -> Iterator[Iterator[Any]]:
    """The output blocks of `dataset` (a Ray Data dataset), each a PyArrow table, read
    in this thread; however the block ends, Ray Data's reading has ended with it."""
    before = set(threading.enumerate())
    tables = iter(dataset.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0))
    try:
        yield tables
    finally:
        tables.close()  # a generator: stops the fetching workers, then the executor
        for thread in reader_threads(since=before):
            thread.join()
