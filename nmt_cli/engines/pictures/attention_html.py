"""One self-contained HTML page to browse every attention map of a sentence.

The weights travel inside the page as JSON and the attention viewer (attention.js and
attention.css, which `nmt serve`'s page uses too) is inlined to draw them, so the file
opens from disk or an e-mail attachment with no server, no network and no matplotlib.
A reader picks the attention (encoder self, decoder self, encoder-decoder), the layer, the
head (or all of them), and heatmap or line view; clicking a token in the line view keeps
only its lines, as the paper's Figure 3 does for 'making'.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import numpy as np

from nmt_cli.engines.pictures.attention_viewer import viewer_script, viewer_style
from nmt_cli.engines.translate.attention import AttentionMaps

DECIMALS = 3  # weights to 0.001: invisible differences cost most of the file


def page_data(maps: AttentionMaps) -> dict[str, Any]:
    """What the page shows, as plain JSON-ready data."""

    def kind(title: str, rows: list[str], cols: list[str], weights: np.ndarray) -> dict[str, Any]:
        return {
            "title": title,
            "rows": rows,
            "cols": cols,
            "layers": np.round(weights.astype(np.float64), DECIMALS).tolist(),
        }

    return {
        "source": maps.source_text,
        "translation": maps.translation,
        "unit": maps.unit_note,
        "kinds": {
            "encoder": kind("encoder self-attention", maps.source, maps.source, maps.encoder),
            "decoder": kind(
                "decoder self-attention", maps.target, maps.decoder_inputs, maps.decoder
            ),
            "cross": kind("encoder-decoder attention", maps.target, maps.source, maps.cross),
        },
    }


def attention_page(maps: AttentionMaps) -> str:
    """The page, as one string of HTML."""
    data = json.dumps(page_data(maps), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("</", "<\\/")  # the JSON can never close its script element
    parts = {
        "TITLE": html.escape(f"Attention: {maps.source_text}"),
        "SOURCE": html.escape(maps.source_text),
        "TRANSLATION": html.escape(maps.translation),
        "STYLE": viewer_style(),
        "SCRIPT": viewer_script(),
        "DATA": data,
    }
    # One pass over the template: a sentence that contains a marker stays as written.
    return re.sub(r"__([A-Z]+)__", lambda marker: parts[marker.group(1)], _TEMPLATE)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
__STYLE__
</style>
</head>
<body>
<p><b>Source:</b> __SOURCE__<br><b>Translation:</b> __TRANSLATION__</p>
<div id="nmt-attention"></div>
<script type="application/json" id="nmt-attention-data">__DATA__</script>
<script>
__SCRIPT__
NmtAttention.mount(
  document.getElementById("nmt-attention"),
  JSON.parse(document.getElementById("nmt-attention-data").textContent),
);
</script>
</body>
</html>
"""
