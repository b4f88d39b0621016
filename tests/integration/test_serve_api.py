"""`nmt serve` through real HTTP: its answers are `nmt translate`'s, LibreTranslate's own
client works with it unchanged, and concurrent clients each get their own sentences back
in order, decoded together."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import JSON, Reply, ServeProcess
from unix_helpers import nmt, no_escape

from tests.fixtures.translation_ckpt import sentences

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # server processes and their workers

# Two forked workers whatever the machine (paused_workers needs them); fp32 everywhere.
DECODING = ["--precision", "fp32", "--threads", "2", "--workers", "2"]
LINES = [*sentences(6, seed=3), "", "the red cat"]


@pytest.fixture(scope="module")
def model(copy_model: Path) -> Path:
    """Trained to copy: each sentence gets a translation of its own."""
    return copy_model


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    process = ServeProcess(
        ["-m", str(model), "--pair", "en-de", *DECODING], tmp_path_factory.mktemp("s")
    )
    process.start()
    yield process
    assert process.stop() == 0, process.output()
    assert "Traceback" not in process.output()


def translate_json(model: Path, lines: list[str], *flags: str) -> list[dict[str, object]]:
    """`nmt translate --json` of `lines`: one record per line."""
    result = nmt(
        "translate", "-m", str(model), "--json", "-q", "--precision", "fp32", "--workers", "1",
        *flags, stdin="".join(line + "\n" for line in lines),
    )  # fmt: skip
    no_escape(result)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def expected(model: Path) -> dict[str, str]:
    """What `nmt translate` gives each sentence the tests send, at the defaults."""
    pool = [*LINES, *(f"{w} {v}" for w in ("red", "big", "the") for v in ("cat", "dog", "tree"))]
    pool += sentences(40, seed=11)
    records = translate_json(model, pool)
    return {
        line: (r["hypotheses"][0]["text"] if r["hypotheses"] else "")  # type: ignore[index]
        for line, r in zip(pool, records, strict=True)
    }


def test_answers_equal_nmt_translate_at_the_same_settings(
    model: Path, server: ServeProcess
) -> None:
    records = translate_json(model, LINES, "--beam", "3", "--nbest", "2", "--alignment")
    reply = server.post("/v1/translate", {"text": LINES, "beam": 3, "nbest": 2, "alignment": True})
    assert reply.status == 200, reply.body
    got = reply.json()["translations"]
    assert [t["source"] for t in got] == LINES
    for mine, theirs in zip(got, records, strict=True):
        hyps = theirs["hypotheses"]
        assert [h["text"] for h in mine["nbest"]] == [h["text"] for h in hyps]
        assert [h["alignment"] for h in mine["nbest"]] == [h["alignment"] for h in hyps]
        assert [h["tokens"] for h in mine["nbest"]] == [h["tokens"] for h in hyps]
        # The same search in another batch: the same scores up to float32 rounding. A
        # log-probability is a difference of logits and their log-sum-exp, numbers of
        # size ~10 whose float32 ulp is ~1e-6: near-certain tokens (scores near 0) differ
        # by that much absolutely, so a relative bound alone would fail them.
        scores = [h["score"] for h in hyps]
        assert [h["score"] for h in mine["nbest"]] == pytest.approx(scores, rel=1e-5, abs=2e-6)
        assert mine["truncated"] is theirs["truncated"]
        if hyps:
            assert (mine["text"], mine["alignment"]) == (hyps[0]["text"], hyps[0]["alignment"])
        else:  # an empty line: an empty translation
            assert (mine["text"], mine["nbest"], mine["alignment"]) == ("", [], "")


def test_libretranslate_answers_are_the_server_defaults(
    server: ServeProcess, expected: dict[str, str]
) -> None:
    reply = server.post("/translate", {"q": LINES[:3], "source": "en", "target": "de"})
    assert reply.json() == {"translatedText": [expected[line] for line in LINES[:3]]}
    # a form body; a text of several lines is translated line by line
    form = f"q={LINES[0]}%0A{LINES[1]}&source=auto&target=de".encode()
    answer = server.request(
        "POST", "/translate", form, {"Content-Type": "application/x-www-form-urlencoded"}
    ).json()
    assert answer == {
        "translatedText": f"{expected[LINES[0]]}\n{expected[LINES[1]]}",
        "detectedLanguage": {"confidence": 100.0, "language": "en"},
    }
    # multipart, as a browser's FormData sends it, with alternatives from the n-best list
    boundary = "b0undary"
    parts = {"q": LINES[2], "source": "en", "target": "de", "alternatives": "2"}
    body = (
        "".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
            for k, v in parts.items()
        )
        + f"--{boundary}--\r\n"
    )
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    answer = server.request("POST", "/translate", body.encode(), multipart).json()
    assert set(answer) == {"translatedText", "alternatives"}
    assert isinstance(answer["alternatives"], list) and len(answer["alternatives"]) <= 2
    assert answer["translatedText"] not in answer["alternatives"]


def test_libretranslate_errors_name_the_pair_and_the_field(server: ServeProcess) -> None:
    def error(fields: dict[str, object]) -> str:
        reply = server.post("/translate", fields)
        assert reply.status == 400, reply.body
        return str(reply.json()["error"])

    assert error({"source": "en", "target": "de"}) == "Invalid request: missing q parameter"
    assert error({"q": "a", "target": "de"}) == "Invalid request: missing source parameter"
    assert "fr is not supported: this server translates en-de" in error(
        {"q": "a", "source": "fr", "target": "de"}
    )
    assert "en-de" in error({"q": "a", "source": "en", "target": "fr"})
    assert "html format is not supported" in error(
        {"q": "a", "source": "en", "target": "de", "format": "html"}
    )
    assert "alternatives" in error({"q": "a", "source": "en", "target": "de", "alternatives": 99})


def test_libretranslatepy_translates_through_the_server_unchanged(
    server: ServeProcess, expected: dict[str, str]
) -> None:
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(f"http://{server.host}:{server.port}")
    assert client.translate(LINES[0], "en", "de") == expected[LINES[0]]
    assert client.translate("the red cat", "auto", "de") == expected["the red cat"]
    assert client.languages() == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]


def test_concurrent_clients_get_their_own_sentences_in_order_decoded_together(
    server: ServeProcess, expected: dict[str, str]
) -> None:
    """32 clients at once, 1-3 sentences each, queued while both decoding lanes hold a
    one-sentence batch (their workers paused): each client gets its own sentences back in
    its order, every sentence is decoded once, and they are decoded together, the first
    lane to come free taking half of them (however the lanes' ends interleave)."""
    pool = sentences(40, seed=11)
    requests = [[pool[(3 * i + k) % len(pool)] for k in range(1 + i % 3)] for i in range(32)]
    replies: dict[int, Reply] = {}
    pair = '{pair="en-de"}'
    names = [
        f"nmt_sentences_total{pair}",
        f"nmt_batch_sentences_count{pair}",
        'nmt_batch_sentences_bucket{pair="en-de",le="16"}',
        'nmt_batch_sentences_bucket{pair="en-de",le="32"}',
    ]
    before = {name: server.metric(name) for name in names}

    def client(i: int, lines: list[str]) -> None:
        replies[i] = server.post("/v1/translate", {"text": lines})

    blockers = [
        threading.Thread(target=client, args=(-k, [t])) for k, t in ((1, "the cat"), (2, "a dog"))
    ]
    threads = [threading.Thread(target=client, args=(i, r)) for i, r in enumerate(requests)]
    with server.paused_workers():
        for count, blocker in enumerate(blockers, 1):
            blocker.start()
            server.wait_for('nmt_decoding_sentences{pair="en-de"}', count)
        for thread in threads:
            thread.start()
        server.wait_for('nmt_queue_sentences{pair="en-de"}', sum(map(len, requests)))
    for thread in [*blockers, *threads]:
        thread.join(60)
    for i, lines in enumerate(requests):
        assert replies[i].status == 200, replies[i].body
        assert [t["text"] for t in replies[i].json()["translations"]] == [
            expected[s] for s in lines
        ]
    for k, line in ((1, "the cat"), (2, "a dog")):
        assert replies[-k].status == 200 and replies[-k].json()["translations"][0]["source"] == line
    sent, batches, upto16, upto32 = (server.metric(name) - before[name] for name in names)
    assert sent == 2 + sum(map(len, requests))  # each sentence decoded once
    # the blockers' batches, then the first lane to come free takes an even share of the
    # 63 waiting and the other lane's 1 (or 0): whole requests up to 32, so 30 to 32; what
    # follows depends on which lane ends first, but 63 sentences need two batches more
    assert upto32 - upto16 >= 1 and batches >= 4
    assert server.metric('nmt_queue_sentences{pair="en-de"}') == 0


def test_native_api_gives_attention_for_one_sentence_and_checks_its_fields(
    server: ServeProcess,
) -> None:
    reply = server.post("/v1/translate", {"text": "the red cat", "attention": True})
    (one,) = reply.json()["translations"]
    attention = one["attention"]
    assert attention["source"][-1] == attention["target"][-1] == "</s>"
    assert len(attention["weights"]) == len(attention["target"])
    assert all(len(row) == len(attention["source"]) for row in attention["weights"])
    assert all(sum(row) == pytest.approx(1.0, abs=1e-3) for row in attention["weights"])
    assert "attention" not in server.post("/v1/translate", {"text": "a"}).json()["translations"][0]
    for body, field in [
        ({"text": ["a", "b"], "attention": True}, "attention"),
        ({"text": "a", "beam": 17}, "beam must be between 1 and 16"),
        ({"text": "a", "beam": 2, "nbest": 3}, "nbest must be between 1 and 2"),
        ({"text": "a", "alignment": 1}, "alignment must be true or false"),
        ({"text": "a", "colour": "red"}, "unknown field 'colour'"),
        ({"txt": "a"}, "unknown field 'txt'"),
        ({"text": ["a", None]}, "text[1] must be a string, not null"),
        ({"text": "a", "source": "en", "target": "fr"}, "en-fr is not served"),
    ]:
        reply = server.post("/v1/translate", body)
        assert reply.status == 400 and field in reply.json()["error"], (body, reply.body)


def test_every_response_has_the_security_policy_and_errors_are_json(server: ServeProcess) -> None:
    page = server.get("/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    viewer = server.get("/attention.js")  # the attention viewer of `nmt attention`'s page
    assert viewer.status == 200 and viewer.headers["content-type"].startswith("text/javascript")
    for reply in [
        page,
        viewer,
        server.get("/languages"),
        server.get("/no/such/page"),
        server.request("POST", "/health"),
        server.post("/v1/translate", {"text": "a"}),
    ]:
        policy = reply.headers["content-security-policy"]
        assert policy.startswith("default-src 'self'") and "http" not in policy
        assert reply.headers["x-content-type-options"] == "nosniff"
    missing = server.get("/no/such/page")
    assert missing.status == 404 and missing.json() == {"error": "Not Found"}
    wrong = server.request("POST", "/health")
    assert wrong.status == 405 and "error" in wrong.json() and "GET" in wrong.headers["allow"]
    assert (
        "access-control-allow-origin"
        not in server.request(
            "GET", "/languages", headers={"Origin": "http://elsewhere.example"}
        ).headers
    )


def test_health_and_metrics(server: ServeProcess) -> None:
    assert server.get("/health").json() == {"status": "ok", "models": ["en-de"]}
    server.get("/odd/path/a"), server.post("/v1/translate", {"text": ["a b", "the dog"]})
    reply = server.get("/metrics")
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.body.decode()
    assert 'nmt_requests_total{route="other",status="404"}' in text
    assert "odd/path" not in text  # a client's paths never become labels
    for name in [
        'nmt_request_seconds_bucket{route="/v1/translate",le="+Inf"}',
        'nmt_sentences_total{pair="en-de"}',
        'nmt_tokens_total{pair="en-de"}',
        'nmt_batch_sentences_count{pair="en-de"}',
    ]:
        assert server.metric(name) > 0, name
    assert server.metric('nmt_queue_sentences{pair="en-de"}') == 0
    assert server.metric("nmt_ready") == 1
    assert server.request("POST", "/v1/translate", b"{", JSON).status == 400
