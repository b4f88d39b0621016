"""How `nmt serve` reads requests and shapes answers, without a server: form bodies,
field checks, LibreTranslate's choice of model and its answer, the metrics' text."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from nmt_cli.core.checkpoint import Checkpoint
from nmt_cli.engines.serve import libretranslate
from nmt_cli.engines.serve.app import Api
from nmt_cli.engines.serve.batcher import Options
from nmt_cli.engines.serve.bodies import ApiError, form_fields, integer, texts
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.serve.service import Models, Pair, recorded_pair
from nmt_cli.engines.serve.settings import ServeConfig
from nmt_cli.engines.translate.translator import TranslatedHypothesis, Translation


def fake_models(*pairs: str) -> Models:
    """Models as the APIs see them: a pair, default options, the longest source."""
    by_pair: dict[Pair, Any] = {}
    for text in pairs:
        pair = Pair.parse(text)
        by_pair[pair] = SimpleNamespace(
            pair=pair, defaults=Options(4, 1), translator=SimpleNamespace(max_source=9)
        )
    return Models(by_pair)


def status_and_message(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value.status, caught.value.message


def test_form_bodies_are_decoded_strictly_by_field() -> None:
    body = b"q=caf%C3%A9+au+lait&source=en&target=de&q=second"
    assert form_fields(body, "application/x-www-form-urlencoded", 100) == {
        "q": "café au lait",
        "source": "en",
        "target": "de",
    }
    assert status_and_message(lambda: form_fields(b"q=%FF", "", 100)) == (
        400,
        "the form field 'q' is not UTF-8 text (byte 0)",
    )
    multipart = b'--x\r\nContent-Disposition: form-data; name="q"\r\n\r\nhallo\r\n--x--\r\n'
    assert form_fields(multipart, "multipart/form-data; boundary=x", 100) == {"q": "hallo"}


def test_field_checks_name_the_field() -> None:
    assert texts("a", "q") == (["a"], False) and texts(["a", "b"], "q") == (["a", "b"], True)
    assert (
        status_and_message(lambda: texts([1], "q"))[1] == "q[0] must be a string, not the number 1"
    )
    assert integer("3", "alternatives", 0, 5, digits=True) == 3
    assert status_and_message(lambda: integer("3", "beam", 1, 5))[1] == (
        "beam must be an integer, not a string"
    )
    assert status_and_message(lambda: integer(True, "beam", 1, 5))[1] == (
        "beam must be an integer, not a boolean"
    )


def test_the_pair_comes_from_the_recipe_or_the_flag() -> None:
    assert Pair.parse("en-de") == Pair("en", "de") and str(Pair("en", "de")) == "en-de"
    ckpt = SimpleNamespace(recipe={"data": {"src": "fr", "tgt": "en"}})
    assert recorded_pair(ckpt) == Pair("fr", "en")  # type: ignore[arg-type]
    for recipe in (None, {}, {"data": {"src": "fr"}}, {"data": "x"}):
        assert recorded_pair(SimpleNamespace(recipe=recipe)) is None  # type: ignore[arg-type]
    assert Checkpoint.__dataclass_fields__["recipe"]  # the field this reads


def test_libretranslate_chooses_the_model_and_lists_the_languages() -> None:
    models = fake_models("en-de", "de-en", "fr-de")
    config = ServeConfig()

    def parse(**fields: object) -> libretranslate.Request:
        return libretranslate.parse({"q": "x", **fields}, models, config)

    assert parse(source="de", target="en").model.pair == Pair("de", "en")
    assert parse(source="auto", target="en").model.pair == Pair("de", "en")
    assert (
        "several models translate into de (from en, fr)"
        in status_and_message(lambda: parse(source="auto", target="de"))[1]
    )
    assert status_and_message(lambda: parse(source="en", target="fr"))[1] == (
        "fr is not available as a target language from en: this server translates "
        "en-de, de-en, fr-de"
    )
    assert libretranslate.languages(models) == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "fr", "name": "French", "targets": ["de"]},
    ]


def test_libretranslate_answers_alternatives_per_text_and_line() -> None:
    models = fake_models("en-de")
    request = libretranslate.parse(
        {"q": ["a\nb", "c"], "source": "auto", "target": "de", "alternatives": 2},
        models,
        ServeConfig(),
    )
    assert request.sentences == ["a", "b", "c"] and request.options == Options(4, 3)

    def translation(source: str, *outputs: str) -> Translation:
        return Translation(source, [TranslatedHypothesis(o, 0.0, 0.0, 1) for o in outputs])

    answer = libretranslate.answer(
        request,
        [translation("a", "A", "A2", "A3"), translation("b", "B"), translation("c", "C", "C")],
    )
    assert answer == {
        "translatedText": ["A\nB", "C"],
        "detectedLanguage": [{"confidence": 100.0, "language": "en"}] * 2,
        "alternatives": [["A2\nB", "A3\nB"], []],  # none repeats the best or another
    }


def test_metrics_are_prometheus_text() -> None:
    metrics = Metrics()
    metrics.request("/translate", 200, 0.02)
    metrics.request("/translate", 200, 3.0)
    metrics.decoded("en-de", 3, 12)
    text = metrics.render({"en-de": 5}, ready=True)
    assert 'nmt_request_seconds_bucket{route="/translate",le="0.025"} 1' in text
    assert 'nmt_request_seconds_bucket{route="/translate",le="+Inf"} 2' in text
    assert 'nmt_request_seconds_count{route="/translate"} 2' in text
    assert 'nmt_requests_total{route="/translate",status="200"} 2' in text
    assert 'nmt_batch_sentences_bucket{pair="en-de",le="2"} 0' in text
    assert 'nmt_batch_sentences_bucket{pair="en-de",le="4"} 1' in text
    assert 'nmt_tokens_total{pair="en-de"} 12' in text
    assert 'nmt_queue_sentences{pair="en-de"} 5' in text
    assert "# TYPE nmt_request_seconds histogram" in text and text.endswith("nmt_ready 1\n")


def test_health_is_503_until_the_models_are_warm() -> None:
    service = Api(fake_models("en-de"), ServeConfig(), Metrics())
    loading = asyncio.run(service.health(None))  # type: ignore[arg-type]
    assert (loading.status_code, json.loads(loading.body)) == (503, {"status": "loading"})
    service.ready = True
    ready = asyncio.run(service.health(None))  # type: ignore[arg-type]
    assert (ready.status_code, json.loads(ready.body)) == (
        200,
        {"status": "ok", "models": ["en-de"]},
    )
