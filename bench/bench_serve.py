"""Serving speed of `nmt serve` under closed-loop clients, next to `nmt translate` offline.

    nmt run recipes/multi30k-en-de.toml          # a trained Multi30k EN-DE model
    python bench/bench_serve.py --model runs/multi30k-en-de/average.pt \\
        [--test DIR/test_2016_flickr.en.gz] [--seconds 60] [--clients 1,8,64]
    python bench/bench_serve.py --model ... --clients '' --soak 600 --soak-clients 16

(DIR: a local copy of Multi30k; by default the raw corpus beside the checkout,
../shared/data/multi30k.) The model must be trained: an untrained one runs every sentence
to the length limit.

Everything runs in one invocation on the same machine, with the same decoding options
(`--precision`, default fp32, and `--beam`, `--threads`, `--workers` when given) for
every system:

- offline reference: `nmt translate` on every test sentence at its default batch, in a
  process of its own (loading not counted), in turn with the largest client level: that
  level runs as `--segments` equal parts, and `nmt translate` before, between and after
  them, because this host's speed drifts by up to 2x from one minute to the next; each
  part's sentences/s is divided by the mean of the two references beside it, and the
  figure is the mean of those shares;
- batch-1 latency: nmt's Translator in this process with batch 1, one sentence at a
  time (the first `--single` sentences), in turn with the same sentence sent alone to the
  server, so that both are measured in the same seconds: the bar of the one-client
  target, and the server's latency beside it;
- the server: `nmt serve` started on a free loopback port, then for each level of
  `--clients`, that many clients, each sending one sentence at a time to `POST /translate`
  (LibreTranslate's API) and the next one as soon as the answer is back, for `--seconds`;
  sentences/s (answers received within the window), p50/p95/p99 latency, errors, and
  the server's mean batch (its /metrics) over the window;
- `--soak S`: `--soak-clients` clients for S seconds, errors and the resident memory of
  the server (and any worker processes it started) from /proc at the start and the end.

The issue's targets are printed next to the figures: at 64 clients (the largest level)
>= 80% of the offline sentences/s; at 1 client a p50 within 1.3x the in-process batch-1
p50; the soak with no error and under 10% growth of resident memory. The clients are
Python threads on the same cores as the server, each on a kept-alive connection that
writes its request's bytes and reads back the status and Content-Length (`KeptAlive`); what
they cost is part of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nmt_cli.text_io import read_lines

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEST = REPO.parent / "shared/data/multi30k/test_2016_flickr.en.gz"
HOST = "127.0.0.1"
THROUGHPUT_TARGET = 0.8  # of offline `nmt translate`, at the largest client level
LATENCY_TARGET = 1.3  # x in-process batch-1 p50, at 1 client
MEMORY_TARGET = 0.10  # resident memory growth over the soak


@dataclass(frozen=True)
class Latencies:
    """Seconds of each answered request."""

    seconds: list[float]

    def percentile_ms(self, p: int) -> float:
        if not self.seconds:
            return float("nan")
        if len(self.seconds) == 1:
            return 1000 * self.seconds[0]
        return 1000 * statistics.quantiles(self.seconds, n=100, method="inclusive")[p - 1]

    def describe(self) -> str:
        return ", ".join(f"p{p} {self.percentile_ms(p):.1f} ms" for p in (50, 95, 99))


@dataclass
class Level:
    """One closed-loop run: `clients` clients for `seconds`."""

    clients: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # answers within the window
    errors: Counter[str] = field(default_factory=Counter)
    mean_batch: float = float("nan")  # sentences the server decoded together, on average

    @property
    def sent_s(self) -> float:
        return len(self.latencies) / self.seconds

    def describe(self) -> str:
        errors = ", ".join(f"{n} {kind}" for kind, n in self.errors.most_common()) or "none"
        return (
            f"{self.clients:>3} client(s): {self.sent_s:.1f} sent/s, "
            f"{Latencies(self.latencies).describe()} "
            f"({len(self.latencies)} answers in {self.seconds:.0f}s, server batches of "
            f"{self.mean_batch:.1f} sentences on average); errors: {errors}"
        )


class Server:
    """`nmt serve` in a process of its own, on a free loopback port."""

    def __init__(
        self, model: Path, decoding: list[str], start_timeout: float, log: IO[bytes]
    ) -> None:
        self.port = free_port()
        self.command = [
            sys.executable, "-m", "nmt_cli", "serve", "-m", str(model),
            "--host", HOST, "--port", str(self.port), *decoding,
        ]  # fmt: skip
        print("server:", " ".join(self.command), flush=True)
        self.log = log  # the server's stdout and stderr, shown when it fails
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"nmt serve did not become healthy:\n{self.output()}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            return request(self.port, "GET", "/health", timeout=5)[0] == 200
        except OSError:
            return False

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", errors="replace")[-4000:]

    def resident_mib(self) -> tuple[float, float]:
        """(the server process, it and every process it started), VmRSS in MiB; the sum
        counts pages that the processes share once in each."""
        sizes = [vm_rss_mib(pid) for pid in process_tree(self.proc.pid)]
        return sizes[0], sum(sizes)

    def stop(self) -> None:
        """SIGTERM (the server drains its requests and exits), then a kill after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def request(
    port: int,
    method: str,
    path: str,
    body: object = None,
    timeout: float = 600,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, bytes]:
    """One HTTP request (on `conn`, kept alive, when given): (status, body)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        data = json.dumps(body).encode("utf-8") if body is not None else None
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        if own:
            conn.close()


class KeptAlive:
    """One client's kept-alive HTTP/1.1 connection for the closed loop, with no more work
    in Python than a request needs: the request's bytes written at once, the answer's
    status line and Content-Length read, its body returned. The clients share the
    server's cores, and `http.client` (header parsing through the email package, a
    buffered file object per response) had cost them 4% of a core at 64 clients."""

    def __init__(self, port: int, timeout: float = 600) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = b""  # bytes read past the last answer

    def post(self, path: str, body: object) -> tuple[int, bytes]:
        """(status, body) of a JSON POST; OSError or ValueError where the answer is not
        HTTP/1.1 with a Content-Length."""
        data = json.dumps(body).encode("utf-8")
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode("ascii") + data)
        while (end := self.pending.find(b"\r\n\r\n")) < 0:
            self.pending += self._read()
        lines = self.pending[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(
            int(value)
            for name, _, value in (line.partition(":") for line in lines[1:])
            if name.strip().lower() == "content-length"
        )
        while len(self.pending) < end + 4 + length:
            self.pending += self._read()
        answer = self.pending[end + 4 : end + 4 + length]
        self.pending = self.pending[end + 4 + length :]
        return status, answer

    def _read(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def process_tree(pid: int) -> list[int]:
    """`pid`, then its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def vm_rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else 0.0


def batch_totals(port: int) -> tuple[float, float]:
    """(sentences, batches) the server has decoded so far, from its /metrics."""
    status, body = request(port, "GET", "/metrics")
    totals = {"sum": 0.0, "count": 0.0}
    if status == 200:
        for found in re.finditer(
            r"^nmt_batch_sentences_(sum|count)\S* (\S+)$", body.decode(), re.M
        ):
            totals[found.group(1)] += float(found.group(2))
    return totals["sum"], totals["count"]


def languages(port: int) -> tuple[str, str]:
    """The model's (source, target) codes, from `GET /languages`."""
    status, body = request(port, "GET", "/languages")
    if status != 200:
        raise SystemExit(f"GET /languages answered {status}: {body[:200]!r}")
    for language in json.loads(body):
        targets = [t for t in language["targets"] if t != language["code"]]
        if targets:
            return language["code"], targets[0]
    raise SystemExit(f"GET /languages names no pair: {body[:200]!r}")


def translate_body(line: str, pair: tuple[str, str]) -> dict[str, str]:
    """One sentence for LibreTranslate's `POST /translate`."""
    return {"q": line, "source": pair[0], "target": pair[1], "format": "text"}


def closed_loop(
    port: int, pair: tuple[str, str], lines: list[str], clients: int, seconds: float
) -> Level:
    """`clients` threads, each sending one sentence (the next of `lines`, in turn) and the
    next as soon as the answer is back, until `seconds` have passed; answers that arrive
    after the window are waited for but not counted."""
    order: Iterator[int] = itertools.count()
    take = threading.Lock()
    level = Level(clients, seconds)
    record = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client() -> None:
        conn = KeptAlive(port)
        start.wait()
        while time.perf_counter() < deadline[0]:
            with take:
                line = lines[next(order) % len(lines)]
            body = translate_body(line, pair)
            t0 = time.perf_counter()
            try:
                status, answer = conn.post("/translate", body)
                ok = status == 200 and isinstance(json.loads(answer).get("translatedText"), str)
                error = "" if ok else f"HTTP {status}"
            except (OSError, ValueError, StopIteration) as exc:
                error = type(exc).__name__
                conn.close()
                conn = KeptAlive(port)
            t1 = time.perf_counter()
            with record:
                if error:
                    level.errors[error] += 1
                elif t1 <= deadline[0]:
                    level.latencies.append(t1 - t0)
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    sentences, batches = batch_totals(port)
    deadline[0] = time.perf_counter() + seconds
    start.wait()
    for thread in threads:
        thread.join()
    more_sentences, more_batches = batch_totals(port)
    if more_batches > batches:
        level.mean_batch = (more_sentences - sentences) / (more_batches - batches)
    return level


def offline_reference(model: Path, decoding: list[str], lines: list[str]) -> float:
    """Sentences/s that `nmt translate` reports on `lines` (decoding only, not loading)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "test.txt"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        command = [
            sys.executable, "-m", "nmt_cli", "translate", "-m", str(model),
            "-i", str(source), "-o", str(Path(tmp) / "out.txt"), *decoding,
        ]  # fmt: skip
        print("offline:", " ".join(command), flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"nmt translate failed:\n{done.stderr}")
    summary = re.search(r"translated .*? lines in .*", done.stderr)
    rate = re.search(r"\(([\d.]+) sent/s", done.stderr)
    if summary is None or rate is None:
        raise SystemExit(f"no summary in nmt translate's output:\n{done.stderr}")
    print(" ", summary.group(0), flush=True)
    return float(rate.group(1))


def against_offline(
    port: int,
    pair: tuple[str, str],
    lines: list[str],
    clients: int,
    args: argparse.Namespace,
    decoding: list[str],
) -> tuple[Level, list[float]]:
    """The level as `args.segments` parts with `nmt translate` offline before, between and
    after them: (the whole level, each part's sentences/s over the mean of the offline
    sentences/s just before and just after it)."""
    parts: list[Level] = []
    offline = [offline_reference(args.model, decoding, lines)]
    for _ in range(args.segments):
        parts.append(closed_loop(port, pair, lines, clients, args.seconds / args.segments))
        print("   part:", parts[-1].describe(), flush=True)
        offline.append(offline_reference(args.model, decoding, lines))
    shares = [part.sent_s / statistics.mean(offline[i : i + 2]) for i, part in enumerate(parts)]
    answered = [len(part.latencies) for part in parts]
    whole = Level(
        clients,
        sum(part.seconds for part in parts),
        [t for part in parts for t in part.latencies],
        sum((part.errors for part in parts), Counter()),
        sum(p.mean_batch * n for p, n in zip(parts, answered, strict=True)) / max(1, sum(answered)),
    )
    return whole, shares


def paired_batch1(
    model: Path, options: dict[str, object], port: int, pair: tuple[str, str], lines: list[str]
) -> tuple[Latencies, Latencies]:
    """(server, in process): each sentence of `lines` sent alone to the server, then
    translated alone by nmt's Translator in this process at batch 1, in turn (the first
    pair is a warm-up). Measured side by side, one sentence apart, because this host's
    speed drifts by up to 2x from one minute to the next."""
    from nmt_cli import Translator

    with Translator.load(model, batch_sentences=1, **options) as translator:
        print(
            f"batch 1, one sentence at a time, the server and in process in turn: "
            f"Translator.load(batch_sentences=1, {options}) "
            f"({translator.precision}, {translator.threads} threads)",
            flush=True,
        )
        conn = http.client.HTTPConnection(HOST, port, timeout=600)
        server, own = [], []
        for i, line in enumerate(lines[:1] + lines):
            body = translate_body(line, pair)
            t0 = time.perf_counter()
            status, answer = request(port, "POST", "/translate", body, conn=conn)
            t1 = time.perf_counter()
            translator.translate([line])
            t2 = time.perf_counter()
            if status != 200:
                raise SystemExit(f"POST /translate answered {status}: {answer[:200]!r}")
            if i:
                server.append(t1 - t0)
                own.append(t2 - t1)
        conn.close()
    return Latencies(server), Latencies(own)


def soak(server: Server, pair: tuple[str, str], lines: list[str], args: argparse.Namespace) -> None:
    own0, all0 = server.resident_mib()
    print(
        f"\nsoak: {args.soak_clients} clients for {args.soak:.0f}s; resident memory at the "
        f"start: server {own0:.0f} MiB, with its workers {all0:.0f} MiB",
        flush=True,
    )
    level = closed_loop(server.port, pair, lines, args.soak_clients, args.soak)
    own1, all1 = server.resident_mib()
    growth = all1 / all0 - 1 if all0 else float("nan")
    errors = sum(level.errors.values())
    print(" ", level.describe())
    print(
        f"  resident memory at the end: server {own1:.0f} MiB, with its workers {all1:.0f} "
        f"MiB: growth {100 * growth:+.1f}%"
    )
    met = errors == 0 and growth < MEMORY_TARGET
    print(
        f"  target: 0 errors and growth < {100 * MEMORY_TARGET:.0f}%: "
        f"{errors} error(s), {100 * growth:+.1f}%: {'met' if met else 'NOT met'}",
        flush=True,
    )


def targets(
    levels: list[Level], shares: list[float], single: tuple[Latencies, Latencies] | None
) -> None:
    """The issue's throughput and latency targets next to what was measured: `shares`,
    each part of the largest level's sentences/s against the offline references beside
    it."""
    by_clients = {level.clients: level for level in levels}
    if not levels or (not shares and single is None):
        return
    print("\ntargets:")
    if shares:
        widest = by_clients[max(by_clients)]
        share = statistics.mean(shares)
        parts = " / ".join(f"{100 * s:.0f}%" for s in shares)
        print(
            f"  {widest.clients} clients: {widest.sent_s:.1f} sent/s = {100 * share:.0f}% of "
            f"offline nmt translate (its {len(shares)} parts against the references beside "
            f"them: {parts}); target >= "
            f"{100 * THROUGHPUT_TARGET:.0f}%: {'met' if share >= THROUGHPUT_TARGET else 'NOT met'}"
        )
    if single is not None:
        p50, bar = single[0].percentile_ms(50), single[1].percentile_ms(50)
        print(
            f"  1 client: p50 {p50:.1f} ms = {p50 / bar:.2f}x in-process batch-1 p50 "
            f"({bar:.1f} ms), sentence by sentence in turn; target <= {LATENCY_TARGET}x: "
            f"{'met' if p50 <= LATENCY_TARGET * bar else 'NOT met'}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--test", type=Path, default=DEFAULT_TEST, help="source sentences (gz)")
    parser.add_argument("--seconds", type=float, default=60, help="per client level")
    parser.add_argument("--clients", default="1,8,64", help="client levels, comma-separated")
    parser.add_argument("--soak", type=float, default=0, help="soak seconds (0: none)")
    parser.add_argument("--soak-clients", type=int, default=16)
    parser.add_argument("--single", type=int, default=100, help="sentences at batch 1")
    parser.add_argument("--precision", default="fp32", help="for every system")
    parser.add_argument("--beam", type=int, help="for every system (default: nmt's)")
    parser.add_argument("--threads", type=int, help="for every system (default: all cores)")
    parser.add_argument("--workers", type=int, help="for every system (default: nmt's)")
    parser.add_argument(
        "--server-flags", default="", help="more `nmt serve` flags, e.g. '--gather-ms 20'"
    )
    parser.add_argument(
        "--segments", type=int, default=4, help="parts of the largest level, offline between"
    )
    parser.add_argument("--skip", default="", help="comma list: offline,single")
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds to healthy")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",") if c]
    args.skip = set(filter(None, args.skip.split(",")))
    if args.segments < 1:
        parser.error("--segments: at least 1")
    return args


def main() -> None:
    args = parse_args()
    print("command:", " ".join(["python", *sys.argv]), flush=True)
    lines = read_lines(args.test)
    options: dict[str, object] = {"precision": args.precision}
    decoding = ["--precision", args.precision]
    for name, flag, field_name in (
        ("beam", "--beam", "beam_size"),
        ("threads", "--threads", "threads"),
        ("workers", "--workers", "workers"),
    ):
        value = getattr(args, name)
        if value is not None:
            decoding += [flag, str(value)]
            options[field_name] = value
    print(
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {len(lines)} sentences from "
        f"{args.test}; decoding options for every system: {' '.join(decoding)}",
        flush=True,
    )
    single: tuple[Latencies, Latencies] | None = None
    shares: list[float] = []
    levels: list[Level] = []
    with tempfile.TemporaryFile() as log:
        server = Server(args.model, decoding + args.server_flags.split(), args.start_timeout, log)
        try:
            pair = languages(server.port)
            closed_loop(server.port, pair, lines, 2, 2)  # warm-up: connections, first batches
            if args.clients:
                print(f"\nclosed loop, {args.seconds:.0f}s a level, POST /translate {pair}:")
            for clients in args.clients:
                if clients == max(args.clients) and "offline" not in args.skip:
                    level, shares = against_offline(
                        server.port, pair, lines, clients, args, decoding
                    )
                    levels.append(level)
                else:
                    levels.append(closed_loop(server.port, pair, lines, clients, args.seconds))
                print(" ", levels[-1].describe(), flush=True)
            if "single" not in args.skip and 1 in args.clients:
                single = paired_batch1(args.model, options, server.port, pair, lines[: args.single])
                print(f"  server:     {single[0].describe()}", flush=True)
                print(f"  in process: {single[1].describe()}", flush=True)
            if args.soak > 0:
                soak(server, pair, lines, args)
        finally:
            server.stop()
        if server.proc.returncode not in (0, -signal.SIGTERM):
            print(f"note: the server exited with {server.proc.returncode}:\n{server.output()}")
    targets(levels, shares, single)


if __name__ == "__main__":
    main()
