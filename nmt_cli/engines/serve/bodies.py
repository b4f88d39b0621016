"""A request's body read within its limit and parsed strictly, each mistake a 4xx that
names what is wrong.

The body is read (counting, or refused unread by its Content-Length) up to the limit:
more is 413. Text must be UTF-8 (and JSON strings free of lone surrogates, which no
encoder can write back); JSON must be an object; form bodies (URL-encoded, as
libretranslatepy and HTML forms send them, or multipart, as browsers' FormData does) are
parsed here so that bytes that are not UTF-8 are refused under their field's name rather
than silently replaced. A form may not upload files: nothing a client sends is read from
or written to the server's disk.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.requests import Request

try:  # the multipart parser of the `serve` extra; other bodies do without it
    from python_multipart import FormParser
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import parse_options_header

    MULTIPART = True
except ImportError:  # pragma: no cover
    MULTIPART = False


class ApiError(Exception):
    """A request the server will not serve: its status, a message for the client, and
    headers (Retry-After) to send with it."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes (else 413, without reading on)."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the request body is larger than the limit of {limit:,} bytes")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"{what} is not UTF-8 text (byte {exc.start})") from None


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object."""
    text = decode_utf8(body, "the request body")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ApiError(400, f"malformed JSON: {exc.msg} ({where})") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_kind(value)}")
    return value


def is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def form_fields(body: bytes, content_type: str, limit: int) -> dict[str, str]:
    """A form body's fields (the first of a repeated name), each value UTF-8 text."""
    raw: list[tuple[bytes, bytes]] = []
    if content_type.split(";")[0].strip().lower() == "multipart/form-data":
        raw = _multipart(body, content_type, limit)
    else:  # application/x-www-form-urlencoded, or a client that did not say
        for item in body.split(b"&"):
            if item:
                key, _, value = item.partition(b"=")
                raw.append((_unquote(key), _unquote(value)))
    fields: dict[str, str] = {}
    for key, value in raw:
        name = decode_utf8(key, "a form field's name")
        if name not in fields:
            fields[name] = decode_utf8(value, f"the form field {name!r}")
    return fields


def _unquote(raw: bytes) -> bytes:
    return unquote_to_bytes(raw.replace(b"+", b" "))


def _multipart(body: bytes, content_type: str, limit: int) -> list[tuple[bytes, bytes]]:
    if not MULTIPART:  # pragma: no cover
        raise ApiError(415, "multipart bodies need python-multipart on the server; send JSON")
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise ApiError(400, "malformed form body: multipart without a boundary")
    fields: list[tuple[bytes, bytes]] = []
    files: list[object] = []
    parser = FormParser(
        "multipart/form-data",
        lambda field: fields.append((field.field_name or b"", field.value or b"")),
        files.append,
        boundary=boundary,
        config={"MAX_MEMORY_FILE_SIZE": limit + 1},  # never a temporary file
    )
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise ApiError(400, f"malformed form body: {exc}") from None
    if files:
        raise ApiError(400, "files cannot be uploaded here: send the text in the field q")
    return fields


def text(value: object, name: str) -> str:
    """A string field, free of lone surrogates (JSON can write them as \\ud800)."""
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string, not {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{name} is not valid text (a lone surrogate at {exc.start})") from None
    return value


def texts(value: object, name: str) -> tuple[list[str], bool]:
    """A string or a list of strings -> (the strings, whether it was a list)."""
    if isinstance(value, list):
        return [text(item, f"{name}[{i}]") for i, item in enumerate(value)], True
    if isinstance(value, str):
        return [text(value, name)], False
    raise ApiError(400, f"{name} must be a string or a list of strings, not {_kind(value)}")


def integer(value: object, name: str, low: int, high: int, digits: bool = False) -> int:
    """An integer field in [low, high]; with `digits`, a string of digits counts as one
    (a form's values are strings, and LibreTranslate takes "3" in JSON too)."""
    if digits and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, not {_kind(value)}")
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}, got {value}")
    return value


def boolean(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {value}"
    return names.get(type(value), type(value).__name__)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")
