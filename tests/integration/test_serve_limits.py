"""`nmt serve` under what clients do wrong or too much: every limit and fault of the issue
is a 4xx (or 503/504) with a message naming what is wrong, never a traceback; work its
client no longer waits for is dropped; keys and CORS are enforced; SIGTERM drains.

One server for the module, with small limits, an API key and one CORS origin (the test
that stops a server starts one of its own, so the tests run in any order). Decoding
is held up where a test needs a request "in decoding" by pausing the server's worker
processes (serve_process.paused_workers), not by a slow model.
"""

from __future__ import annotations

import http.client
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import JSON, Reply, ServeProcess

from tests.fixtures.translation_ckpt import random_checkpoint, tiny_vocab

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # server processes, requests held for seconds

KEY = "k-123"
BEARER = {"Authorization": f"Bearer {KEY}"}
ALLOWED = "http://allowed.example"
PAIR = 'pair="en-de"'
LIMITS = [
    *("--queue-limit", "8", "--max-sentences", "4", "--max-chars", "300"),
    *("--max-body", "4000", "--timeout", "3", "--drain-timeout", "30"),
]


def limited_server(root: Path) -> ServeProcess:
    """A server with the small limits, the API key and the CORS origin, started."""
    model = random_checkpoint(root / "m.pt", tiny_vocab(), max_positions=16)
    keys = root / "keys.txt"
    keys.write_text(f"# the team's keys\n{KEY}\n\nother-key\n", encoding="utf-8")
    process = ServeProcess(
        [
            *("-m", str(model), "--pair", "en-de", "--precision", "fp32"),
            *("--threads", "2", "--workers", "2", *LIMITS),
            *("--api-key-file", str(keys), "--cors-origin", ALLOWED),
        ],
        root,
    )
    return process.start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One server for the tests that leave it serving."""
    process = limited_server(tmp_path_factory.mktemp("limits"))
    yield process
    process.stop()
    assert "Traceback" not in process.output(), process.output()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """A server of its own, for a test that stops it."""
    process = limited_server(tmp_path)
    yield process
    process.stop()  # already stopped, unless the test failed first
    assert "Traceback" not in process.output(), process.output()


def native(
    server: ServeProcess, body: bytes | object, headers: dict[str, str] | None = None
) -> Reply:
    raw = body if isinstance(body, bytes) else None
    if raw is None:
        return server.post("/v1/translate", body, {**BEARER, **(headers or {})})
    return server.request("POST", "/v1/translate", raw, {**JSON, **BEARER, **(headers or {})})


def libre(server: ServeProcess, fields: dict[str, object]) -> Reply:
    return server.post("/translate", {"source": "en", "target": "de", "api_key": KEY, **fields})


def refused(reply: Reply, status: int, *fragments: str) -> str:
    """The reply is `status` with a JSON error holding every fragment."""
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["content-type"] == "application/json"
    message = reply.json()["error"]
    assert "Traceback" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return str(message)


def metric(server: ServeProcess, name: str) -> float:
    return server.metric(name, BEARER)


def wait_for(server: ServeProcess, name: str, value: float) -> None:
    server.wait_for(name, value, headers=BEARER)


class Later:
    """A request sent from a thread; `.reply` once answered."""

    def __init__(self, send: object, *args: object) -> None:
        self.reply: Reply | None = None
        self.thread = threading.Thread(target=self._run, args=(send, *args))
        self.thread.start()

    def _run(self, send: object, *args: object) -> None:
        self.reply = send(*args)  # type: ignore[operator]

    def result(self) -> Reply:
        self.thread.join(60)
        assert self.reply is not None
        return self.reply


def blocked(server: ServeProcess) -> list[Later]:
    """Two one-sentence requests, one in each decoding lane (a lane a worker), both in
    decoding on the paused workers once this returns: what comes next waits in the queue."""
    requests = []
    for text in ("the cat", "a dog"):
        requests.append(Later(native, server, {"text": [text]}))
        wait_for(server, f"nmt_decoding_sentences{{{PAIR}}}", len(requests))
    return requests


def test_a_body_over_the_limit_is_413_unread(server: ServeProcess) -> None:
    body = b'{"text": "' + b"a " * 2500 + b'"}'
    refused(native(server, body), 413, "limit of 4,000 bytes")
    # without a Content-Length (chunked), counted as it arrives
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request(
        "POST",
        "/v1/translate",
        iter([body[:3000], body[3000:]]),
        {**JSON, **BEARER},
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 413 and b"4,000 bytes" in response.read()
    conn.close()


def test_too_many_sentences_or_characters_are_400_naming_the_limit(server: ServeProcess) -> None:
    refused(native(server, {"text": ["a"] * 5}), 400, "5 sentences", "limit of 4", "max_sentences")
    refused(native(server, {"text": "a" * 301}), 400, "301 characters", "max_chars")
    refused(libre(server, {"q": ["a", "b", "c", "d", "e"]}), 400, "max_sentences")
    # a text's lines are its sentences
    refused(libre(server, {"q": "a\nb\nc\nd\ne"}), 400, "5 sentences", "max_sentences")


def test_an_overlong_sentence_is_truncated_with_a_warning(server: ServeProcess) -> None:
    long = " ".join(["the red cat sat on the mat"] * 6)  # far over 15 subword tokens
    reply = native(server, {"text": ["a dog", long]})
    assert reply.status == 200
    answer = reply.json()
    assert [t["truncated"] for t in answer["translations"]] == [False, True]
    assert answer["warnings"] == [
        "sentence 2 is longer than 15 subword tokens: only its first 15 were translated"
    ]
    assert libre(server, {"q": long}).json()["warnings"] == [
        "sentence 1 is longer than 15 subword tokens: only its first 15 were translated"
    ]


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (b'{"text": "a"', ("malformed JSON", "line 1, column 13")),
        (b"[1, 2]", ("must be a JSON object, not a list",)),
        (b'{"text": "a", "beam": NaN}', ("malformed JSON", "NaN")),
        (b"[" * 1990 + b"]" * 1990, ("malformed JSON",)),
        (b'{"text": "caf\xe9"}', ("the request body is not UTF-8 text (byte 13)",)),
        (b'{"text": "\\ud800 a"}', ("text is not valid text (a lone surrogate",)),
        (b'{"text": 5}', ("text must be a string or a list of strings, not the number 5",)),
        (b'{"text": {"a": 1}}', ("text must be a string or a list of strings, not an object",)),
        (b'{"text": ["a", ["b"]]}', ("text[1] must be a string, not a list",)),
        (b'{"text": "a", "beam": "4"}', ("beam must be an integer, not a string",)),
        (b'{"text": "a", "beam": 2.5}', ("beam must be an integer, not the number 2.5",)),
        (b'{"text": "a", "nbest": 0}', ("nbest must be between 1",)),
        (b'{"text": "a", "attention": "yes"}', ("attention must be true or false",)),
        (b'{"text": "a", "source": 1, "target": "de"}', ("source must be a string",)),
        (b"", ("malformed JSON",)),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(
    server: ServeProcess, body: bytes, fragments: tuple[str, ...]
) -> None:
    refused(native(server, body), 400, *fragments)


def test_malformed_libretranslate_requests_are_400_naming_the_field(server: ServeProcess) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    bad_utf8 = f"q=caf%E9&source=en&target=de&api_key={KEY}".encode()
    refused(
        server.request("POST", "/translate", bad_utf8, form), 400, "form field 'q' is not UTF-8"
    )
    raw = f"q=caf\xe9&source=en&target=de&api_key={KEY}".encode("latin-1")
    refused(server.request("POST", "/translate", raw, form), 400, "'q' is not UTF-8")
    boundary = "xyz"
    upload = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="api_key"\r\n\r\n{KEY}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="/etc/passwd"'
        f"\r\n\r\nroot\r\n--{boundary}--\r\n"
    ).encode()
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    refused(
        server.request("POST", "/translate", upload, multipart), 400, "files cannot be uploaded"
    )
    garbled = {"Content-Type": "multipart/form-data; boundary=abc"}
    refused(server.request("POST", "/translate", b"not multipart", garbled), 400, "malformed form")
    refused(libre(server, {"q": 7}), 400, "q must be a string or a list of strings")
    refused(libre(server, {"q": "a", "alternatives": "many"}), 400, "alternatives parameter")
    refused(server.request("POST", "/translate", b"{oops", JSON), 400, "malformed JSON")


def test_a_full_queue_is_503_or_429_with_retry_after_and_nothing_is_kept(
    server: ServeProcess,
) -> None:
    with server.paused_workers():
        firsts = blocked(server)
        waiting = [Later(native, server, {"text": ["a", "b", "c", "d"]}) for _ in range(2)]
        wait_for(server, f"nmt_queue_sentences{{{PAIR}}}", 8)
        full = native(server, {"text": "the dog"})
        refused(full, 503, "queue is full")
        assert full.headers["retry-after"] == "1"
        full = libre(server, {"q": "the dog"})
        assert refused(full, 429, "queue is full").startswith("Slowdown:")
        assert full.headers["retry-after"] == "1"
        assert metric(server, f"nmt_queue_sentences{{{PAIR}}}") == 8
        # the waiting ones pass their deadline (--timeout 3) while the batch is decoded
        for request in waiting:
            refused(request.result(), 504, "not ready in time")
    for first in firsts:
        refused(first.result(), 504)
    wait_for(server, f"nmt_decoding_sentences{{{PAIR}}}", 0)


def test_a_request_past_its_timeout_is_504_and_its_work_is_dropped(server: ServeProcess) -> None:
    dropped = f'nmt_dropped_sentences_total{{{PAIR},reason="timeout"}}'
    done = f"nmt_sentences_total{{{PAIR}}}"
    before, dropped_before = metric(server, done), metric(server, dropped)
    with server.paused_workers():
        firsts = blocked(server)
        late = Later(native, server, {"text": ["red dog", "big cat", "the mat"]})
        start = time.monotonic()
        refused(late.result(), 504, "not ready in time", "dropped")
        # never before its --timeout of 3 s (a bound a loaded machine cannot break: it
        # only makes the answer later, and Later.result waits for it up to a minute)
        assert time.monotonic() - start >= 2.5
        assert metric(server, dropped) == dropped_before + 3
        assert metric(server, f"nmt_queue_sentences{{{PAIR}}}") == 0
    for first in firsts:
        first.result()
    wait_for(server, f"nmt_decoding_sentences{{{PAIR}}}", 0)
    assert metric(server, done) == before + 2  # the blocked batch only


def test_a_client_that_leaves_costs_nothing_more(server: ServeProcess) -> None:
    dropped = f'nmt_dropped_sentences_total{{{PAIR},reason="disconnected"}}'
    done = f"nmt_sentences_total{{{PAIR}}}"
    before, dropped_before = metric(server, done), metric(server, dropped)
    with server.paused_workers():
        firsts = blocked(server)
        body = b'{"text": ["red dog", "big cat", "the mat"]}'
        head = (
            f"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection((server.host, server.port)) as client:
            client.sendall(head + body)
            wait_for(server, f"nmt_queue_sentences{{{PAIR}}}", 3)
        wait_for(server, dropped, dropped_before + 3)
        assert metric(server, f"nmt_queue_sentences{{{PAIR}}}") == 0
    for first in firsts:
        first.result()
    wait_for(server, f"nmt_decoding_sentences{{{PAIR}}}", 0)
    assert metric(server, done) == before + 2


def test_keys_are_needed_where_the_api_says(server: ServeProcess) -> None:
    text = {"text": "the cat"}
    refused(server.post("/v1/translate", text), 403, "Authorization: Bearer")
    refused(server.post("/v1/translate", text, {"Authorization": "Bearer nope"}), 403)
    refused(server.post("/v1/translate", text, {"Authorization": f"Basic {KEY}"}), 403)
    assert server.post("/v1/translate", text, {"Authorization": "Bearer other-key"}).status == 200
    fields = {"q": "the cat", "source": "en", "target": "de"}
    refused(server.post("/translate", fields), 403, "server operator")
    refused(server.post("/translate", {**fields, "api_key": "nope"}), 403, "Invalid API key")
    odd = b'{"q": "a", "source": "en", "target": "de", "api_key": "\\udc80"}'
    refused(server.request("POST", "/translate", odd, JSON), 403, "Invalid API key")
    assert server.post("/translate", {**fields, "api_key": KEY}).status == 200
    refused(server.get("/metrics"), 403)
    for path in ("/", "/health", "/languages"):
        assert server.get(path).status == 200, path


def test_cors_only_for_the_named_origin(server: ServeProcess) -> None:
    allowed = server.get("/languages", {"Origin": ALLOWED})
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    other = server.get("/languages", {"Origin": "http://other.example"})
    assert "access-control-allow-origin" not in other.headers
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    ok = server.request("OPTIONS", "/v1/translate", headers={"Origin": ALLOWED, **preflight})
    assert ok.status == 200 and "POST" in ok.headers["access-control-allow-methods"]
    no = server.request(
        "OPTIONS", "/v1/translate", headers={"Origin": "http://other.example", **preflight}
    )
    assert no.status == 400 and "access-control-allow-origin" not in no.headers


def test_garbage_on_the_connection_harms_nothing(server: ServeProcess) -> None:
    for junk in [
        b"\x00\xff garbage\r\n\r\n",
        b"POST /v1/translate HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ]:
        with socket.create_connection((server.host, server.port), timeout=10) as client:
            client.sendall(junk)
            answer = client.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400") and b"Traceback" not in answer
    refused(server.request("PUT", "/v1/translate", b"{}", BEARER), 405)
    assert native(server, {"text": "the cat"}).status == 200


def test_sigterm_finishes_the_request_in_flight_and_exits_0(own_server: ServeProcess) -> None:
    server = own_server
    with server.paused_workers():
        in_flight = blocked(server)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # new connections are refused at once
            try:
                socket.create_connection((server.host, server.port), timeout=1).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "still accepting after SIGTERM"
            time.sleep(0.05)
    replies = [request.result() for request in in_flight]
    assert all(r.status == 200 and len(r.json()["translations"]) == 1 for r in replies)
    assert server.proc.wait(30) == 0
    output = server.output()
    assert "stopping: finishing the requests in flight" in output and "stopped" in output
