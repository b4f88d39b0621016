"""The server's own API: `POST /v1/translate`, what `nmt translate --json` tells per line.

Request (JSON): `text` (a string or a list of strings, one sentence each), and optionally
`beam`, `nbest` (at most the beam), `alignment` (Moses "i-j" word pairs), `attention` (the
best hypothesis's source attention, for one sentence), and `source`/`target` where the
server has several models. Answer:

    {"translations": [{"source": str, "text": str, "score": float, "log_prob": float,
                       "tokens": int, "nbest": [{"text", "score", "log_prob", "tokens",
                       "alignment"}...], "alignment": "0-0 1-1" | null, "truncated": bool,
                       "attention": {"source": [pieces], "target": [pieces],
                                     "weights": [[float]]}  (only when asked for)}],
     "warnings": [str]  (only when a sentence was cut to the model's length)}

An empty sentence gets an empty text, score 0 and no n-best.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nmt_cli.engines.serve.batcher import Options
from nmt_cli.engines.serve.bodies import ApiError, boolean, integer, text, texts
from nmt_cli.engines.serve.limits import truncation_warnings
from nmt_cli.engines.serve.service import Model, Models
from nmt_cli.engines.serve.settings import ServeConfig

if TYPE_CHECKING:
    from nmt_cli.engines.translate.translator import TranslatedHypothesis, Translation

FIELDS = ("text", "beam", "nbest", "alignment", "attention", "source", "target")


@dataclass(frozen=True)
class Request:
    model: Model
    sentences: list[str]
    options: Options


def parse(body: dict[str, Any], models: Models, config: ServeConfig) -> Request:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
    if "text" not in body:
        raise ApiError(400, "text is missing: give a string or a list of strings")
    sentences, _ = texts(body["text"], "text")
    model = _model(body, models)
    defaults = model.defaults
    beam = integer(body.get("beam", defaults.beam), "beam", 1, config.max_beam)
    nbest = integer(body.get("nbest", min(defaults.nbest, beam)), "nbest", 1, beam)
    alignment = boolean(body.get("alignment", False), "alignment")
    attention = boolean(body.get("attention", False), "attention")
    if attention and len(sentences) != 1:
        raise ApiError(400, f"attention is given for one sentence at a time, not {len(sentences)}")
    return Request(model, sentences, Options(beam, nbest, alignment, attention))


def _model(body: dict[str, Any], models: Models) -> Model:
    served = models.describe()
    if "source" not in body and "target" not in body:
        if len(models.by_pair) == 1:
            return next(iter(models))
        raise ApiError(400, f"source and target: this server translates {served}; name a pair")
    source = text(body.get("source"), "source")
    target = text(body.get("target"), "target")
    for model in models:
        if (model.pair.source, model.pair.target) == (source, target):
            return model
    raise ApiError(400, f"source and target: {source}-{target} is not served; it serves {served}")


def answer(request: Request, translations: list[Translation]) -> dict[str, Any]:
    options = request.options
    out: dict[str, Any] = {
        "translations": [_translation(t, options) for t in translations],
    }
    warnings = truncation_warnings(translations, request.model.translator.max_source)
    if warnings:
        out["warnings"] = warnings
    return out


def _translation(translation: Translation, options: Options) -> dict[str, Any]:
    hyps = [_hypothesis(h, options.alignment) for h in translation.hypotheses]
    best = hyps[0] if hyps else {"text": "", "score": 0.0, "log_prob": 0.0, "tokens": 0}
    record = {
        "source": translation.source,
        **{k: best[k] for k in ("text", "score", "log_prob", "tokens")},
        "nbest": hyps,
        "alignment": best.get("alignment", "") if options.alignment else None,
        "truncated": translation.truncated,
    }
    attention = translation.hypotheses[0].attention if translation.hypotheses else None
    if options.attention and attention is not None:
        record["attention"] = dataclasses.asdict(attention)
    return record


def _hypothesis(hyp: TranslatedHypothesis, alignment: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": hyp.text,
        "score": _number(hyp.score),
        "log_prob": _number(hyp.log_prob),
        "tokens": hyp.length,
    }
    if alignment:
        out["alignment"] = hyp.alignment or ""
    return out


def _number(value: float) -> float | None:
    """JSON has no infinity: a score that is not finite is null."""
    return value if math.isfinite(value) else None
