"""`nmt serve`: translation over HTTP, batching sentences across requests.

`settings.py` (ServeConfig), `service.py` (the models by language pair), `batcher.py`
(the queue and decoding thread of each model), `dispatch.py` (a request waiting for its
results), `bodies.py` and `limits.py` (reading and checking requests), `libretranslate.py`
and `native.py` (the two APIs), `metrics.py` (Prometheus text), `app.py` (the routes),
`server.py` (uvicorn, signals, the stop). The modules that import Starlette or uvicorn
are imported only after `require_installed`, so a machine without the `serve` extra gets
one line saying what to install.
"""

from __future__ import annotations

from nmt_cli.optional import require


def require_installed() -> None:
    """Starlette and uvicorn (nmt-cli[serve]), or a MissingPackage error naming them."""
    for module in ("starlette", "uvicorn"):
        require(module, purpose="nmt serve", avoid="translate files with nmt translate")
