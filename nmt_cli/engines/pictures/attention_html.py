"""One self-contained HTML page to browse every attention map of a sentence.

The weights travel inside the page as JSON and a few lines of JavaScript draw them, so the
file opens from disk or an e-mail attachment with no server, no network and no matplotlib.
A reader picks the attention (encoder self, decoder self, encoder-decoder), the layer, the
head (or all of them), and heatmap or line view; clicking a token in the line view keeps
only its lines, as the paper's Figure 3 does for 'making'.
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np

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
    title = html.escape(f"Attention: {maps.source_text}")
    return (
        _TEMPLATE.replace("__TITLE__", title)
        .replace("__SOURCE__", html.escape(maps.source_text))
        .replace("__TRANSLATION__", html.escape(maps.translation))
        .replace("__DATA__", data)
    )


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.controls label { margin-right: 1.2em; }
table.heat { border-collapse: collapse; font-size: 12px; margin-top: 1em; }
table.heat td { width: 22px; height: 22px; border: 1px solid #eee; padding: 0; }
table.heat th { font-weight: normal; padding: 0 4px; white-space: nowrap; }
table.heat thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
svg text { font-size: 13px; cursor: pointer; }
.note { color: #666; font-size: 12px; }
</style>
</head>
<body>
<p><b>Source:</b> __SOURCE__<br><b>Translation:</b> __TRANSLATION__</p>
<div class="controls">
<label>attention <select id="kind"></select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<label>view <select id="view"><option value="heat">heatmap</option>
<option value="lines">lines</option></select></label>
</div>
<p class="note" id="note"></p>
<div id="figure"></div>
<script type="application/json" id="nmt-attention-data">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("nmt-attention-data").textContent);
const $ = (id) => document.getElementById(id);
const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
let focus = null;

function fill(select, items) {
  const keep = select.value;
  select.innerHTML = "";
  items.forEach(([value, label]) => {
    const option = document.createElement("option");
    option.value = value; option.textContent = label; select.appendChild(option);
  });
  if ([...select.options].some((o) => o.value === keep)) select.value = keep;
}

function current() {
  const kind = data.kinds[$("kind").value];
  const layer = kind.layers[Number($("layer").value)];
  const head = $("head").value;
  return { kind, layer, heads: head === "all" ? layer.map((_, h) => h) : [Number(head)] };
}

function heatmap({ kind, layer, heads }) {
  const n = heads.length;
  const table = document.createElement("table");
  table.className = "heat";
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  kind.cols.forEach((c) => {
    const th = document.createElement("th"); th.textContent = c; head.appendChild(th);
  });
  const body = table.createTBody();
  kind.rows.forEach((r, i) => {
    const row = body.insertRow();
    const th = document.createElement("th"); th.textContent = r; row.appendChild(th);
    kind.cols.forEach((c, j) => {
      const w = heads.reduce((s, h) => s + layer[h][i][j], 0) / n;
      const cell = row.insertCell();
      cell.style.background = `rgba(8, 81, 156, ${w})`;
      cell.title = `${r} -> ${c}: ${w.toFixed(3)}`;
    });
  });
  return table;
}

function lines({ kind, layer, heads }) {
  const ns = "http://www.w3.org/2000/svg";
  const step = 22, width = 520, top = 10;
  const svg = document.createElementNS(ns, "svg");
  const height = top + step * Math.max(kind.rows.length, kind.cols.length);
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  const x0 = 200, x1 = 320;
  heads.forEach((h) => {
    kind.rows.forEach((_, i) => {
      if (focus !== null && focus !== i) return;
      kind.cols.forEach((_, j) => {
        const w = layer[h][i][j];
        if (w < 0.01) return;
        const line = document.createElementNS(ns, "line");
        line.setAttribute("x1", x0); line.setAttribute("y1", top + i * step);
        line.setAttribute("x2", x1); line.setAttribute("y2", top + j * step);
        line.setAttribute("stroke", palette[h % palette.length]);
        line.setAttribute("stroke-opacity", w); line.setAttribute("stroke-width", 2);
        svg.appendChild(line);
      });
    });
  });
  const label = (text, x, y, anchor, i) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y + 4); t.setAttribute("text-anchor", anchor);
    t.textContent = text;
    if (i !== null) {
      if (focus === i) t.setAttribute("font-weight", "bold");
      t.addEventListener("click", () => { focus = focus === i ? null : i; draw(); });
    }
    svg.appendChild(t);
  };
  kind.rows.forEach((r, i) => label(r, x0 - 6, top + i * step, "end", i));
  kind.cols.forEach((c, j) => label(c, x1 + 6, top + j * step, "start", null));
  return svg;
}

function draw() {
  const state = current();
  const view = $("view").value;
  const all = view === "heat" ? "mean over heads" : "all heads, one colour each";
  const heads = $("head").value === "all" ? all : `head ${Number($("head").value) + 1}`;
  $("note").textContent = `${state.kind.title}, layer ${Number($("layer").value) + 1}, ${heads}. `
    + `Rows attend to columns. Tokens: ${data.unit}.`
    + (view === "lines" ? " Line opacity = weight; click a token to keep only its lines." : "");
  $("figure").replaceChildren(view === "heat" ? heatmap(state) : lines(state));
}

function refresh() {
  const kind = data.kinds[$("kind").value];
  fill($("layer"), kind.layers.map((_, l) => [String(l), `${l + 1} of ${kind.layers.length}`]));
  fill($("head"), [["all", "all"], ...kind.layers[0].map((_, h) => [String(h), String(h + 1)])]);
  focus = null;
  draw();
}

fill($("kind"), Object.entries(data.kinds).map(([key, kind]) => [key, kind.title]));
$("kind").addEventListener("change", refresh);
["layer", "head", "view"].forEach((id) => $(id).addEventListener("change", () => {
  focus = null; draw();
}));
refresh();
</script>
</body>
</html>
"""
