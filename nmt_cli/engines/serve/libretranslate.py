"""LibreTranslate's HTTP API, as its server (LibreTranslate/app.py) defines it and its
clients (libretranslatepy, browser extensions, its own page) use it.

`POST /translate` takes JSON or a form: `q` (a string, or in JSON a list of strings),
`source` (a code, or "auto": here, the source language of the model that translates into
`target`), `target`, `format` ("text"; "html" is not translated), `alternatives` (that
many other translations from the n-best list, without duplicates) and `api_key`. It
answers `{"translatedText": ...}` shaped as `q` was, `alternatives` when asked for, and
`detectedLanguage` for "auto". Errors are `{"error": "..."}` with LibreTranslate's
messages and statuses (400, 403, 429 for a full queue), and `warnings` tells of sentences
cut to the model's length. A text of several lines is translated line by line (the model
translates sentences) and its translations joined by newlines again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nmt_cli.engines.serve.batcher import Options
from nmt_cli.engines.serve.bodies import ApiError, integer, text, texts
from nmt_cli.engines.serve.limits import truncation_warnings
from nmt_cli.engines.serve.service import Model, Models
from nmt_cli.engines.serve.settings import ServeConfig

if TYPE_CHECKING:
    from nmt_cli.engines.translate.translator import Translation

# English names of the languages a model is most likely to translate; other codes are
# listed under their code.
NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian",
    "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip
_LINES = re.compile(r"\r\n|\r|\n")


def languages(models: Models) -> list[dict[str, Any]]:
    """`GET /languages`: every language a model reads or writes, with its targets."""
    pairs = models.pairs()
    codes = sorted({p.source for p in pairs} | {p.target for p in pairs})
    return [
        {
            "code": code,
            "name": NAMES.get(code, code),
            "targets": sorted(p.target for p in pairs if p.source == code),
        }
        for code in codes
    ]


@dataclass(frozen=True)
class Request:
    model: Model
    texts: list[str]  # as given: each may hold several lines
    batch: bool  # q was a list
    alternatives: int
    auto: bool  # source was "auto"

    @property
    def sentences(self) -> list[str]:
        return [line for t in self.texts for line in _LINES.split(t)]

    @property
    def options(self) -> Options:
        defaults = self.model.defaults
        if not self.alternatives:
            return defaults
        nbest = self.alternatives + 1  # the best and as many others
        return Options(max(defaults.beam, nbest), nbest)


def api_key(fields: dict[str, Any]) -> str | None:
    value = fields.get("api_key")
    return value if isinstance(value, str) else None


def parse(fields: dict[str, Any], models: Models, config: ServeConfig) -> Request:
    """A /translate request's fields, checked in LibreTranslate's order."""
    q = fields.get("q")
    if not q:
        raise ApiError(400, "Invalid request: missing q parameter")
    given, batch = texts(q, "q")
    source, target = (fields.get(name) for name in ("source", "target"))
    for name, value in (("source", source), ("target", target)):
        if not value:
            raise ApiError(400, f"Invalid request: missing {name} parameter")
        text(value, name)
    fmt = fields.get("format") or "text"
    if fmt != "text":
        raise ApiError(400, f"{fmt} format is not supported: this server translates text")
    try:
        alternatives = max(
            0, integer(fields.get("alternatives", 0), "alternatives", -(2**31), 2**31, True)
        )
    except ApiError:
        raise ApiError(400, "Invalid request: alternatives parameter is not a number") from None
    most = config.max_beam - 1
    if alternatives > most:
        raise ApiError(400, f"Invalid request: alternatives parameter must be <= {most}")
    model = _model(models, str(source), str(target))
    return Request(model, given, batch, alternatives, source == "auto")


def _model(models: Models, source: str, target: str) -> Model:
    """The model for source -> target; "auto": the one that translates into target."""
    served = models.describe()
    if source == "auto":
        found = [m for m in models if m.pair.target == target]
        if len(found) > 1:
            sources = ", ".join(m.pair.source for m in found)
            raise ApiError(
                400, f"source auto: several models translate into {target} (from {sources}); "
                "name the source language",
            )  # fmt: skip
    else:
        if source not in {m.pair.source for m in models}:
            raise ApiError(400, f"{source} is not supported: this server translates {served}")
        found = [m for m in models if m.pair.source == source and m.pair.target == target]
    if not found:
        raise ApiError(
            400, f"{target} is not available as a target language from {source}: this "
            f"server translates {served}",
        )  # fmt: skip
    return found[0]


def answer(request: Request, translations: list[Translation]) -> dict[str, Any]:
    """LibreTranslate's answer: per text, its lines' best translations (and alternatives)."""
    results, alternatives, start = [], [], 0
    for given in request.texts:
        count = len(_LINES.split(given))
        lines = translations[start : start + count]
        start += count
        best = "\n".join(t.text for t in lines)
        results.append(best)
        others = ["\n".join(_nth(t, k) for t in lines) for k in range(1, request.alternatives + 1)]
        alternatives.append(list(dict.fromkeys(o for o in others if o != best)))
    out: dict[str, Any] = {"translatedText": results if request.batch else results[0]}
    if request.auto:
        detected = {"confidence": 100.0, "language": request.model.pair.source}
        out["detectedLanguage"] = [detected] * len(results) if request.batch else detected
    if request.alternatives:
        out["alternatives"] = alternatives if request.batch else alternatives[0]
    warnings = truncation_warnings(translations, request.model.translator.max_source)
    if warnings:
        out["warnings"] = warnings
    return out


def _nth(translation: Translation, k: int) -> str:
    """The k-th best hypothesis (0: the best), or the best where there are fewer."""
    hyps = translation.hypotheses
    return hyps[k].text if k < len(hyps) else translation.text
