"""Running the server: the listening socket, the models, uvicorn, and a clean stop.

The address is tried first, so a port in use fails at once, before minutes of loading.
The listening socket itself is made after the models are loaded and their worker
processes forked (before any thread exists, see Translator.start_workers): a forked
worker would otherwise hold a copy of it, and the port would stay open after the server
closed it. Until then a client is refused rather than left hanging, and /health answers
503 until the models are warm.

SIGTERM or Ctrl-C stops accepting connections, lets the requests in flight finish for
up to `drain_s` seconds, stops the decoding threads and worker processes and returns
(the command exits 0: for a server, being told to stop is how it ends). A second Ctrl-C
stops at once.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from nmt_cli import collector
from nmt_cli.config import DecodeConfig
from nmt_cli.engines.serve.app import Api, create_app
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.serve.service import load_models
from nmt_cli.engines.serve.settings import ServeConfig
from nmt_cli.errors import NmtError
from nmt_cli.text_io import check_readable

log = logging.getLogger("nmt.serve")


def serve(
    models: Sequence[Path],
    pairs: Sequence[str],
    decode: DecodeConfig,
    alignment_layer: int,
    config: ServeConfig,
    *,
    verbose: bool = False,
    on_listen: Callable[[str], None] = lambda url: None,
    on_stop: Callable[[], None] = lambda: None,
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> None:
    """Serve `models` until stopped. `on_listen(url)` is told where, once listening;
    `on_stop()` when a signal starts the stop. Import this module after
    `nmt_cli.engines.serve.require_installed()`."""
    for path in models:  # before taking the port
        check_readable(path)
    _log_to_stderr(verbose)
    if config.port:
        _bind(config.host, config.port).close()  # in use? say so before loading
    metrics = Metrics()
    # The models' Python objects (hundreds of thousands) live as long as the server: loaded
    # with the collector paused and then frozen out of its reach (nmt_cli/collector.py), a
    # full collection never walks them, so never pauses the event loop, and every request
    # in flight, for as long as that would take.
    with collector.paused():
        loaded = load_models(
            models, pairs, decode, alignment_layer, config, metrics, on_compile, on_fallback
        )
    try:
        sock = _bind(config.host, config.port)
    except NmtError:
        loaded.close(wait=False)
        raise
    try:
        service = Api(loaded, config, metrics, verbose)
        server = _Server(
            uvicorn.Config(
                create_app(service),
                log_level="info" if verbose else "warning",
                access_log=verbose,
                timeout_graceful_shutdown=math.ceil(config.drain_s),
                limit_concurrency=config.max_connections,
                timeout_keep_alive=5,
                server_header=False,
                lifespan="on",
            ),
            on_listen=lambda: on_listen(f"http://{_address(sock)}"),
            on_stop=on_stop,
        )
        server.run(sockets=[sock])
    finally:
        sock.close()


class _Server(uvicorn.Server):
    """uvicorn's server, except that a signal is not raised again once it has stopped
    (uvicorn re-raises it, so the process would die by it instead of exiting 0)."""

    def __init__(
        self, config: uvicorn.Config, on_listen: Callable[[], None], on_stop: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self.on_listen, self.on_stop = on_listen, on_stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # listening
            self.on_listen()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop now
        elif not self.should_exit:
            self.should_exit = True
            self.on_stop()


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise NmtError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise NmtError(f"cannot listen on {host} port {port}: {exc.strerror}") from None
    return sock


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _log_to_stderr(verbose: bool) -> None:
    """The server's own messages (warm-up, internal errors) on stderr, one line each."""
    logger = logging.getLogger("nmt.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("nmt serve: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
