"""What `GET /metrics` reports, in Prometheus' text format (version 0.0.4), written here.

A server's few numbers do not need a client library and its process-wide registry: one
`Metrics` object per app holds them, updated under one lock from the event loop (requests)
and the decoding threads (batches), and rendered on demand. Counters only grow; rates
(sentences per second, tokens per second) are Prometheus' `rate()` of them. Labels take
values from fixed sets only (route names, status codes, the models' language pairs), so a
client cannot grow the output by sending odd paths.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

Labels = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    """Counts of observations at or below each bound (cumulative when rendered)."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: Labels) -> list[str]:
        out, running = [], 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f"{name}_bucket{_labels((*labels, ('le', le)))} {running}")
        out.append(f"{name}_sum{_labels(labels)} {self.total:.6f}")
        out.append(f"{name}_count{_labels(labels)} {self.n}")
        return out


class Metrics:
    """The server's counters, gauges and histograms; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()  # (route, status)
        self._latency: dict[str, Histogram] = {}  # by route
        self._sentences: Counter[str] = Counter()  # by pair
        self._tokens: Counter[str] = Counter()
        self._batches: dict[str, Histogram] = {}  # sentences decoded together, by pair
        self._dropped: Counter[tuple[str, str]] = Counter()  # (pair, reason): sentences
        self._decoding: Counter[str] = Counter()  # sentences being decoded now, by pair

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[route, status] += 1
            self._latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def decoding(self, pair: str, change: int) -> None:
        """`change` more sentences are being decoded now (negative: that many ended)."""
        with self._lock:
            self._decoding[pair] += change

    def decoded(self, pair: str, sentences: int, tokens: int) -> None:
        """One batch of `sentences` gathered from the queue and decoded together."""
        with self._lock:
            self._sentences[pair] += sentences
            self._tokens[pair] += tokens
            self._batches.setdefault(pair, Histogram(BATCH_BUCKETS)).observe(sentences)

    def dropped(self, pair: str, reason: str, sentences: int) -> None:
        """Sentences taken off the queue undecoded: "timeout", "disconnected", "stopping"."""
        with self._lock:
            self._dropped[pair, reason] += sentences

    def render(self, queued: Mapping[str, int], ready: bool) -> str:
        """The exposition text; `queued` is each pair's queue depth now."""
        with self._lock:
            out = [
                *_head("nmt_requests_total", "counter", "HTTP requests by route and status."),
                *(
                    f"nmt_requests_total{_labels((('route', r), ('status', str(s))))} {n}"
                    for (r, s), n in sorted(self._requests.items())
                ),
                *_head("nmt_request_seconds", "histogram", "Time to answer a request."),
                *(
                    line
                    for route, hist in sorted(self._latency.items())
                    for line in hist.lines("nmt_request_seconds", (("route", route),))
                ),
                *_counter("nmt_sentences_total", "Sentences translated.", self._sentences),
                *_counter(
                    "nmt_tokens_total",
                    "Target subword tokens written (best hypotheses).",
                    self._tokens,
                ),
                *_head(
                    "nmt_batch_sentences", "histogram", "Sentences of requests decoded together."
                ),
                *(
                    line
                    for pair, hist in sorted(self._batches.items())
                    for line in hist.lines("nmt_batch_sentences", (("pair", pair),))
                ),
                *_head(
                    "nmt_dropped_sentences_total",
                    "counter",
                    "Queued sentences never decoded: their request timed out or left.",
                ),
                *(
                    f"nmt_dropped_sentences_total{_labels((('pair', p), ('reason', r)))} {n}"
                    for (p, r), n in sorted(self._dropped.items())
                ),
                *_head("nmt_queue_sentences", "gauge", "Sentences waiting to be decoded."),
                *(
                    f"nmt_queue_sentences{_labels((('pair', pair),))} {n}"
                    for pair, n in sorted(queued.items())
                ),
                *_head("nmt_decoding_sentences", "gauge", "Sentences being decoded now."),
                *(
                    f"nmt_decoding_sentences{_labels((('pair', pair),))} {n}"
                    for pair, n in sorted(self._decoding.items())
                ),
                *_head("nmt_ready", "gauge", "1 once every model is loaded and warm."),
                f"nmt_ready {int(ready)}",
            ]
        return "\n".join(out) + "\n"


def _head(name: str, kind: str, text: str) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


def _counter(name: str, text: str, values: Mapping[str, int]) -> list[str]:
    return [
        *_head(name, "counter", text),
        *(f"{name}{_labels((('pair', p),))} {n}" for p, n in sorted(values.items())),
    ]


def _labels(labels: Labels) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels) + "}" if labels else ""
