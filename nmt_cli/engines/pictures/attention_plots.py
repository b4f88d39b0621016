"""Attention as the paper draws it (Figures 3-5) and as heatmaps.

Lines: the sentence twice, side by side, a line from each attending token (left) to each
attended token (right) whose opacity is the weight; one colour per head, all heads of a
layer in one picture (Figure 3), or one head (Figure 4). Heatmaps: one panel per
(layer, head), rows attend to columns, white 0 to dark blue 1 on every panel, so panels
compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nmt_cli.engines.pictures.backend import new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MIN_WEIGHT = 0.01  # lighter lines are invisible anyway; leaving them out keeps SVGs small
HEAD_COLOURS = "tab10"
HEATMAP = "Blues"


@dataclass(frozen=True)
class Panel:
    """One heatmap: its title and matrix (rows attend to columns)."""

    title: str
    weights: np.ndarray


def head_colour(head: int, heads: int) -> tuple[float, float, float, float]:
    """The colour of `head` (0-based), distinct for up to 20 heads."""
    from matplotlib import colormaps

    name = HEAD_COLOURS if heads <= 10 else "tab20"
    return tuple(colormaps[name](head % colormaps[name].N))  # type: ignore[return-value]


def draw_lines(
    weights: np.ndarray,
    tokens: Sequence[str],
    heads: Sequence[int],
    title: str,
    note: str,
    focus: Sequence[int] = (),
) -> Figure:
    """weights (heads, n, n) of one layer's self-attention; `heads` (0-based) are drawn,
    and with `focus` only the lines from those token positions (Figure 3's 'making')."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    n = len(tokens)
    total_heads = weights.shape[0]
    fig = new_figure(6.0, max(3.0, 0.26 * n + 1.4))
    ax = fig.add_subplot()
    rows = list(focus) if focus else range(n)
    segments, colours = [], []
    for head in heads:
        rgb = head_colour(head, total_heads)[:3]
        for i in rows:
            for j in range(n):
                w = float(weights[head, i, j])
                if w >= MIN_WEIGHT:
                    segments.append([(0.0, -i), (1.0, -j)])
                    colours.append((*rgb, min(1.0, w)))
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=2.0))
    for i, token in enumerate(tokens):
        strong = "bold" if i in rows and focus else "normal"
        ax.text(-0.03, -i, token, ha="right", va="center", fontsize=9, fontweight=strong)
        ax.text(1.03, -i, token, ha="left", va="center", fontsize=9)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(-n + 0.5, 0.8)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=head_colour(h, total_heads), label=f"head {h + 1}") for h in heads]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(handles), 8),
        fontsize=8,
        frameon=False,
    )
    fig.text(0.5, 0.0, note, ha="center", va="bottom", fontsize=7, color="0.35")
    return fig


def draw_heatmaps(
    panels: Sequence[Panel],
    row_tokens: Sequence[str],
    col_tokens: Sequence[str],
    columns: int,
    title: str,
    note: str,
    row_label: str,
    col_label: str,
) -> Figure:
    """A grid of heatmaps, `columns` panels a row, one shared colour scale 0..1; token
    labels on the outer panels only (every panel has the same rows and columns)."""
    grid_rows = -(-len(panels) // columns)
    cell = 0.16 if max(len(row_tokens), len(col_tokens)) > 20 else 0.22
    side = max(1.6, cell * max(len(row_tokens), len(col_tokens)) + 0.4)
    fig = new_figure(columns * side + 1.6, grid_rows * side + 1.4)
    axes = fig.subplots(grid_rows, columns, squeeze=False)
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.axis("off")
            continue
        image = ax.imshow(panels[k].weights, vmin=0.0, vmax=1.0, cmap=HEATMAP, aspect="auto")
        ax.set_title(panels[k].title, fontsize=8)
        _label(ax, row_tokens, col_tokens, left=k % columns == 0, bottom=k + columns >= len(panels))
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=min(1.0, 3.0 / (grid_rows * side)) + 0.3)
        bar.set_label("attention weight", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.supylabel(row_label, fontsize=8)
    fig.supxlabel(f"{col_label}\n{note}", fontsize=8)
    return fig


def _label(ax: Axes, rows: Sequence[str], cols: Sequence[str], left: bool, bottom: bool) -> None:
    size = 7 if max(len(rows), len(cols)) <= 30 else 5
    ax.set_yticks(range(len(rows)), rows if left else [""] * len(rows), fontsize=size)
    ax.set_xticks(
        range(len(cols)), cols if bottom else [""] * len(cols), fontsize=size, rotation=90
    )
    ax.tick_params(length=0)
