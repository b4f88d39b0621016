"""The ASGI application of `nmt serve`: its routes, and what every response carries.

Routes:
    GET  /              the page (page.html), /page.js, /page.css, and the attention
                        viewer of `nmt attention`'s page (/attention.js, /attention.css)
    GET  /languages     LibreTranslate's list of languages (libretranslate.py)
    POST /translate     LibreTranslate's translation (JSON or form)
    POST /v1/translate  the native API (native.py documents its shape)
    GET  /health        200 {"status": "ok"} once every model is loaded and warm, else 503
    GET  /metrics       Prometheus text (metrics.py)

Every error is JSON, `{"error": "<what is wrong>"}`, with its status: 400 (the message
names the field or limit), 403 (a key is needed), 404/405, 413 (body over the limit), 429
(LibreTranslate) or 503 (native) with Retry-After when the queue is full, 504 when the
answer would come after the timeout; 500 only for a bug, logged on the server and never
with a traceback in the response. Every response carries a Content-Security-Policy that
allows this server's own files and nothing from elsewhere (no inline scripts or styles).

With API keys, /translate needs the `api_key` field (LibreTranslate's way) and
/v1/translate and /metrics an `Authorization: Bearer KEY` header; the page, /languages and
/health stay open. Cross-origin requests are answered only for `cors_origins`.

Starlette (routing, CORS) rather than FastAPI: the API is a few routes whose bodies are
parsed and checked by hand (bodies.py) to give LibreTranslate's exact errors, so a
validation layer (pydantic) would add a dependency and answers in its own format.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt_cli.engines.pictures.attention_viewer import viewer_script, viewer_style
from nmt_cli.engines.serve import libretranslate, native
from nmt_cli.engines.serve.batcher import DeadlineExceeded, QueueFull, Stopping
from nmt_cli.engines.serve.bodies import ApiError, form_fields, is_json, json_object, read_body
from nmt_cli.engines.serve.dispatch import ClientLeft, translate
from nmt_cli.engines.serve.limits import check_size
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.serve.service import Models
from nmt_cli.engines.serve.settings import ServeConfig

log = logging.getLogger("nmt.serve")

CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
HTML, JS, CSS = (f"text/{kind}; charset=utf-8" for kind in ("html", "javascript", "css"))
PLACEHOLDER = "<!DOCTYPE html><title>nmt serve</title><p>POST /v1/translate or /translate.</p>"
RETRY_AFTER_S = 1
STOP_WAIT_S = 2.0  # for a batch still being decoded after the drain
Endpoint = Callable[[Request], Awaitable[Response]]


class Api:
    """The routes and their state: the models, the limits, the metrics, whether warm."""

    def __init__(
        self, models: Models, config: ServeConfig, metrics: Metrics, verbose: bool = False
    ) -> None:
        self.models, self.config, self.metrics, self.verbose = models, config, metrics, verbose
        self.ready = False
        self.failure = ""  # why warming up failed
        self._keys = [key.encode() for key in config.api_keys]

    # --- the routes -------------------------------------------------------------------

    async def translate_native(self, request: Request) -> Response:
        self._check_key(_bearer(request))
        body = json_object(await read_body(request, self.config.body_bytes))
        parsed = native.parse(body, self.models, self.config)
        check_size(parsed.sentences, self.config, "text")
        results = await translate(
            parsed.model, parsed.sentences, parsed.options, self.config.timeout_s, request.receive
        )
        return JSONResponse(native.answer(parsed, results))

    async def translate_libre(self, request: Request) -> Response:
        fields = await self._fields(request)
        self._check_key(libretranslate.api_key(fields), libre=True)
        parsed = libretranslate.parse(fields, self.models, self.config)
        sentences = parsed.sentences
        check_size(sentences, self.config, "q")
        results = await translate(
            parsed.model, sentences, parsed.options, self.config.timeout_s, request.receive
        )
        return JSONResponse(libretranslate.answer(parsed, results))

    async def languages(self, request: Request) -> Response:
        return JSONResponse(libretranslate.languages(self.models))

    async def health(self, request: Request) -> Response:
        if self.ready:
            return JSONResponse({"status": "ok", "models": [str(p) for p in self.models.pairs()]})
        if self.failure:
            return JSONResponse({"status": "failed", "error": self.failure}, 503)
        return JSONResponse({"status": "loading"}, 503)

    async def metrics_text(self, request: Request) -> Response:
        self._check_key(_bearer(request))
        queued = {str(model.pair): model.batcher.queued for model in self.models}
        text = self.metrics.render(queued, self.ready)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- life -----------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Each model's first translation, then its decoding thread; ready after all."""
        try:
            for model in self.models:
                await asyncio.to_thread(model.warm_up)
                model.batcher.start()
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error("warming up failed: %s", self.failure, exc_info=self.verbose)
            return
        self.ready = True
        log.info("ready: translating %s", self.models.describe())

    def stop(self) -> None:
        """Decode nothing new and stop the workers. This comes after the server's drain:
        a batch still being decoded then has no one waiting for it, and gets a moment."""
        ended = all([model.batcher.stop(STOP_WAIT_S) for model in self.models])
        self.models.close(wait=ended)

    # --- helpers ----------------------------------------------------------------------

    async def _fields(self, request: Request) -> dict[str, Any]:
        """LibreTranslate's fields: a JSON object, or a form (URL-encoded or multipart)."""
        body = await read_body(request, self.config.body_bytes)
        content_type = request.headers.get("content-type", "")
        if is_json(content_type):
            return json_object(body)
        return dict(form_fields(body, content_type, self.config.body_bytes))

    def _check_key(self, given: str | None, libre: bool = False) -> None:
        if not self._keys:
            return
        raw = given.encode("utf-8", "surrogatepass") if given is not None else None
        if raw is not None and any(hmac.compare_digest(raw, key) for key in self._keys):
            return
        if libre:
            message = "Invalid API key" if given else "Please contact the server operator for a key"
        else:
            message = "a valid API key is needed: send the header Authorization: Bearer KEY"
        raise ApiError(403, message)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def guarded(endpoint: Endpoint, queue_full: int, verbose: bool) -> Endpoint:
    """The endpoint with every failure turned into a JSON error response: a full queue
    is `queue_full` (429 for LibreTranslate's API, 503 for the native one)."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.headers)
        except QueueFull:
            message = "the translation queue is full; retry later"
            if queue_full == 429:
                message = f"Slowdown: {message}"
            return _error(queue_full, message, {"Retry-After": str(RETRY_AFTER_S)})
        except DeadlineExceeded:
            return _error(504, "the translation was not ready in time; the request was dropped")
        except Stopping:
            return _error(503, "the server is stopping", {"Retry-After": str(RETRY_AFTER_S)})
        except ClientLeft:
            return _error(499, "the client closed the connection")
        except Exception as exc:
            log.error(
                "internal error answering %s: %s: %s",
                request.url.path, type(exc).__name__, exc, exc_info=verbose,
            )  # fmt: skip
            return _error(500, "internal error; the server's log has the details")

    return run


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status, headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405, as JSON like every other error."""
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail), dict(exc.headers or {}))


def _static(body: str, media_type: str) -> Endpoint:
    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return serve


def page_files() -> dict[str, tuple[str, str]]:
    """URL path -> (text, media type): the page's own files (a placeholder page where
    they are missing) and the attention viewer it shares with `nmt attention`'s page."""
    own = resources.files(__package__)
    files: dict[str, tuple[str, str]] = {"/": (PLACEHOLDER, HTML)}
    for path, name, media_type in [
        ("/", "page.html", HTML),
        ("/page.js", "page.js", JS),
        ("/page.css", "page.css", CSS),
    ]:
        if own.joinpath(name).is_file():
            files[path] = (own.joinpath(name).read_text(encoding="utf-8"), media_type)
    with contextlib.suppress(FileNotFoundError):
        files["/attention.js"] = (viewer_script(), JS)
        files["/attention.css"] = (viewer_style(), CSS)
    return files


class Observed:
    """Outermost middleware: the security headers on every response, and each request's
    status and time in the metrics, under its route (or "other": a client's odd paths do
    not become labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.request(route, status, time.perf_counter() - start)


def create_app(service: Api) -> Starlette:
    """The application over `service`; its lifespan warms the models and stops them."""
    verbose, config = service.verbose, service.config
    api = [
        Route("/translate", guarded(service.translate_libre, 429, verbose), methods=["POST"]),
        Route("/v1/translate", guarded(service.translate_native, 503, verbose), methods=["POST"]),
        # libretranslatepy sends GET /languages with an (empty) form body; accept POST too
        Route("/languages", guarded(service.languages, 503, verbose), methods=["GET", "POST"]),
        Route("/health", guarded(service.health, 503, verbose), methods=["GET"]),
        Route("/metrics", guarded(service.metrics_text, 503, verbose), methods=["GET"]),
    ]
    files = [
        Route(path, _static(text, media_type), methods=["GET"])
        for path, (text, media_type) in page_files().items()
    ]
    routes = [*api, *files]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        warming = asyncio.create_task(service.warm_up())
        try:
            yield
        finally:
            warming.cancel()
            service.stop()

    middleware = [
        Middleware(Observed, metrics=service.metrics, routes=frozenset(r.path for r in routes))
    ]
    if config.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type"],
                max_age=600,
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
