"""`nmt serve`: translation over HTTP (LibreTranslate's API and the native one), with the
decoding settings of `nmt translate` and sentences of concurrent requests batched."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from nmt_cli.commands.common import (
    Verbosity,
    info,
    quiet_option,
    user_errors,
    verbose_option,
    warn,
)
from nmt_cli.commands.translate import (
    FALLBACK,
    decode_config_of_flags,
    precision_flag,
    translate,
)
from nmt_cli.core.settings import SettingError
from nmt_cli.errors import NmtError, UsageError

# `nmt translate`'s decoding options, the same flags with the same help.
_T: dict[str, Any] = {n: p.default for n, p in inspect.signature(translate).parameters.items()}
_FLAGS = {
    "serve.port": "--port",
    "serve.gather_ms": "--gather-ms",
    "serve.return_ms": "--return-ms",
    "serve.max_batch": "--max-batch",
    "serve.queue_sentences": "--queue-limit",
    "serve.body_bytes": "--max-body",
    "serve.max_sentences": "--max-sentences",
    "serve.max_chars": "--max-chars",
    "serve.max_beam": "--max-beam",
    "serve.timeout_s": "--timeout",
    "serve.drain_s": "--drain-timeout",
    "serve.max_connections": "--max-connections",
}


def serve(
    model: list[Path] = typer.Option(
        ..., "--model", "-m", metavar="PATH", help="Checkpoint (.pt); repeat: one per pair."
    ),
    pair: list[str] = typer.Option(
        [], "--pair", metavar="SRC-TGT", help="A model's languages, if it records none."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", help="Port; 0 = any free one (printed)."),
    beam: int = _T["beam"],
    alpha: float = _T["alpha"],
    max_len_a: float = _T["max_len_a"],
    max_len_b: int = _T["max_len_b"],
    nbest: int = typer.Option(
        1, "--nbest", help="Hypotheses a sentence unless a request asks.", show_default=False
    ),
    batch_size: int = _T["batch_size"],
    batch_tokens: int = _T["batch_tokens"],
    precision: str = _T["precision"],
    device: str = _T["device"],
    threads: int = _T["threads"],
    workers: int = _T["workers"],
    python_step: bool = _T["python_step"],
    alignment_layer: int = _T["alignment_layer"],
    gather_ms: float = typer.Option(5.0, "--gather-ms", help="Wait for more requests (ms)."),
    return_ms: float = typer.Option(
        30.0, "--return-ms", help="Max wait for answered clients (ms)."
    ),
    max_batch: int = typer.Option(
        0,
        "--max-batch",
        help="Sentences a lane decodes at once; 0: --batch-size.",
        show_default=False,
    ),
    queue_limit: int = typer.Option(2048, "--queue-limit", help="Sentences waiting, at most."),
    max_body: int = typer.Option(1_000_000, "--max-body", help="Request body, at most (bytes)."),
    max_sentences: int = typer.Option(128, "--max-sentences", help="Sentences a request."),
    max_chars: int = typer.Option(20_000, "--max-chars", help="Characters a request."),
    max_beam: int = typer.Option(16, "--max-beam", help="Largest beam a request may ask."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds a request may take."),
    drain_timeout: float = typer.Option(
        10.0, "--drain-timeout", help="At a stop, seconds to drain."
    ),
    max_connections: int = typer.Option(
        512, "--max-connections", help="Open connections, at most."
    ),
    api_key_file: Path | None = typer.Option(
        None, "--api-key-file", help="Keys a request must give, one a line."
    ),
    cors_origin: list[str] = typer.Option(
        [], "--cors-origin", metavar="ORIGIN", help="A web origin that may call; repeat."
    ),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Serve translations over HTTP until stopped (Ctrl-C or SIGTERM).

    \b
    POST /translate     LibreTranslate's API (JSON or form: q, source,
                        target, alternatives, api_key)
    POST /v1/translate  {"text": str or [str], "beam", "nbest",
                        "alignment", "attention"}: what --json gives
    GET  /languages, /health, /metrics (Prometheus), / (a page)

    Each model translates one language pair: the one its training recipe
    recorded, or --pair SRC-TGT (one per --model, in order). Decoding is that
    of nmt translate with the same options; sentences of concurrent requests
    are decoded together. Hypotheses are ranked as there:

    \b
      score(Y) = log P(Y|X) / lp(Y),  lp(Y) = ((5 + |Y|) / 6) ** alpha

    It listens on 127.0.0.1 unless --host says
    otherwise; elsewhere, give --api-key-file. A stop finishes the requests in
    flight (up to --drain-timeout) and exits 0.
    """
    from nmt_cli.engines.serve import require_installed
    from nmt_cli.engines.serve.settings import ServeConfig

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        cfg = decode_config_of_flags(
            beam_size=beam, length_penalty=alpha, max_len_a=max_len_a, max_len_b=max_len_b,
            nbest=nbest, batch_sentences=batch_size, batch_tokens=batch_tokens,
            precision=precision_flag(precision), device=device, threads=threads, workers=workers,
            compiled_step=not python_step,
        )  # fmt: skip
        try:
            config = ServeConfig(
                host=host, port=port, gather_ms=gather_ms, return_ms=return_ms,
                max_batch=max_batch,
                queue_sentences=queue_limit, body_bytes=max_body, max_sentences=max_sentences,
                max_chars=max_chars, max_beam=max_beam, timeout_s=timeout,
                drain_s=drain_timeout, max_connections=max_connections,
                api_keys=_keys(api_key_file), cors_origins=tuple(cors_origin),
            )  # fmt: skip
        except SettingError as exc:
            flag = _FLAGS.get(exc.key, exc.key)
            raise UsageError(f"{flag}{str(exc).removeprefix(exc.key)}") from None
        if config.public and not config.api_keys:
            warn(
                f"listening on {host} without --api-key-file: anyone who can reach this "
                "machine can use the server"
            )
        require_installed()
        from nmt_cli.engines.serve.server import serve as run_server

        run_server(
            model,
            pair,
            cfg,
            alignment_layer,
            config,
            verbose=verbose,
            on_listen=lambda url: info(f"listening on {url} (Ctrl-C stops)", verbosity),
            on_stop=lambda: info(
                f"stopping: finishing the requests in flight (at most {drain_timeout:g} s)",
                verbosity,
            ),
            on_compile=lambda text: info(text, verbosity),
            on_fallback=lambda reason: warn(f"{FALLBACK}: {reason}"),
        )
        info("stopped", verbosity)


def _keys(path: Path | None) -> frozenset[str]:
    """The API keys of `path`: one a line; blank lines and lines starting with # skipped."""
    if path is None:
        return frozenset()
    from nmt_cli.text_io import check_readable, read_lines

    check_readable(path)
    keys = frozenset(
        line.strip() for line in read_lines(path) if line.strip() and not line.startswith("#")
    )
    if not keys:
        raise NmtError(f"--api-key-file {path}: holds no key")
    return keys
