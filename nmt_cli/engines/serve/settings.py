"""What `nmt serve` is configured with besides the decoding settings: where it listens,
how it batches, and the limits that keep one client from taking the server's memory or
time from the others.

Every limit has a range check naming its `serve.*` key (the command shows its flag), and
the defaults are sized for a CPU serving sentences: a request is at most 128 sentences
and 20,000 characters, the queue holds 2,048 sentences (about ten seconds of a small
CPU's work), and a body larger than 1 MB is refused before it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt_cli.core.settings import SettingError, above, at_least, below


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # loopback: another host must be asked for
    port: int = 8080  # 0: any free port (printed when listening)
    gather_ms: float = 5.0  # how long a batch waits for more requests after its first
    return_ms: float = 30.0  # a lane waits for the clients it just answered (<= 3% of the batch)
    max_batch: int = 0  # sentences a decoding lane takes at once; 0: the batch size
    queue_sentences: int = 2048  # sentences waiting, all requests together; then 503/429
    body_bytes: int = 1_000_000  # a request body larger is refused (413) unread
    max_sentences: int = 128  # a request's sentences (lines)
    max_chars: int = 20_000  # a request's characters, all its sentences together
    max_beam: int = 16  # the largest beam (and n-best) a request may ask for
    timeout_s: float = 30.0  # a request not answered by then gets 504, its work dropped
    drain_s: float = 10.0  # at SIGTERM/Ctrl-C, how long requests in flight may finish
    max_connections: int = 512  # open connections; more are answered 503 by the server
    api_keys: frozenset[str] = frozenset()  # empty: no key needed
    cors_origins: tuple[str, ...] = ()  # origins a browser may call from; empty: none

    def __post_init__(self) -> None:
        at_least("serve", self, 0, "port", "gather_ms", "return_ms", "max_batch", "drain_s")
        below("serve", self, 65536, "port")
        below("serve", self, 10_000, "gather_ms", "return_ms")  # seconds are a mistake
        at_least("serve", self, 1, "queue_sentences", "body_bytes", "max_sentences")
        at_least("serve", self, 1, "max_chars", "max_beam", "max_connections")
        above("serve", self, 0, "timeout_s")
        if self.queue_sentences < self.max_sentences:
            raise SettingError(
                "serve.queue_sentences",
                f"must hold at least one request's sentences ({self.max_sentences}), "
                f"got {self.queue_sentences}",
            )

    @property
    def public(self) -> bool:
        """Whether the server listens beyond this machine's loopback interface."""
        return not (self.host in ("localhost", "::1") or self.host.startswith("127."))
