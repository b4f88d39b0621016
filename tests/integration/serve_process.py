"""A real `nmt serve` process on a free loopback port, and plain HTTP to it, for the
tests of the server.

The server is started as `python -m nmt_cli serve --port 0 ...` with its output in a file
(no pipe to fill), its address read from its "listening on" line, and it is ready when
GET /health answers 200. `paused_workers` stops its decoding worker processes (SIGSTOP)
for a while: a request of two or more sentences is then "being decoded" for exactly as
long as a test needs, so queueing, timeouts, disconnects and the drain at SIGTERM are
tested without depending on how fast this machine decodes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON = {"Content-Type": "application/json"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ServeProcess:
    def __init__(self, args: list[str], workdir: Path) -> None:
        self.log = workdir / "serve.log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.host, self.port = "127.0.0.1", 0

    def start(self, timeout: float = 180.0) -> ServeProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nmt_cli", "serve", "--port", "0", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while not (found := re.search(r"listening on http://([\d.]+):(\d+)", self.output())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"nmt serve did not start:\n{self.output()}")
            time.sleep(0.1)
        self.host, self.port = found.group(1), int(found.group(2))
        while self.get("/health").status != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"nmt serve never became ready:\n{self.output()}")
            time.sleep(0.1)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Reply(
                response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
            )
        finally:
            conn.close()

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request("GET", path, headers=headers)

    def post(self, path: str, value: Any, headers: dict[str, str] | None = None) -> Reply:
        return self.request("POST", path, json.dumps(value).encode(), {**JSON, **(headers or {})})

    def metric(self, name: str, headers: dict[str, str] | None = None) -> float:
        """The value of one sample, e.g. 'nmt_sentences_total{pair="en-de"}' (0 if absent)."""
        text = self.get("/metrics", headers).body.decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_for(self, name: str, value: float, timeout: float = 30.0, **kw: Any) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.metric(name, **kw)) != value:
            assert time.monotonic() < deadline, f"{name} is {now}, not {value}"
            time.sleep(0.02)

    def workers(self) -> list[int]:
        """The server's child processes: its decoding workers."""
        assert self.proc is not None
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.proc.pid:
                    children.append(int(stat.parent.name))
        return children

    @contextlib.contextmanager
    def paused_workers(self) -> Iterator[None]:
        workers = self.workers()
        assert workers, "the server has no worker processes (use --workers 2 --threads 2)"
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the server and wait for it; its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            for pid in self.workers():  # never leave a stopped worker behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
