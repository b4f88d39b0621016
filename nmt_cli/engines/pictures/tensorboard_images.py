"""Attention heatmaps as plain RGB arrays, for TensorBoard's image panel.

Drawn with numpy alone: training writes them at every validation, and a figure toolkit
there would cost more than the validation's own decoding. Heads sit side by side, each
cell a square of pixels from white (0) to dark blue (1), so that TensorBoard's step slider
shows the attention sharpen as training goes on. The tokens go beside them as text.
"""

from __future__ import annotations

import numpy as np

BLUE = np.array([8, 81, 156], dtype=np.float64)  # the darkest blue of matplotlib's "Blues"
GAP = 4  # pixels between heads, grey so that white (no attention) edges stay visible
GAP_GREY = 160


def heads_image(weights: np.ndarray, cell: int = 0) -> np.ndarray:
    """(heads, rows, cols) weights in [0, 1] -> (3, H, W) uint8, heads left to right.

    `cell` pixels per weight; 0 picks one that makes a head about 256 pixels across."""
    heads, rows, cols = weights.shape
    cell = cell or max(2, min(16, 256 // max(rows, cols)))
    height, width = rows * cell, cols * cell
    image = np.full((height, heads * (width + GAP) - GAP, 3), float(GAP_GREY))
    for h in range(heads):
        w = np.clip(weights[h], 0.0, 1.0).repeat(cell, axis=0).repeat(cell, axis=1)
        x = h * (width + GAP)
        image[:, x : x + width] = 255.0 - w[..., None] * (255.0 - BLUE)
    return np.round(image).astype(np.uint8).transpose(2, 0, 1)


def tokens_text(rows: list[str], cols: list[str]) -> str:
    """The axes of a heatmap in words, as TensorBoard's text panel shows markdown."""
    return f"rows (attending): `{' '.join(rows)}`  \ncolumns (attended): `{' '.join(cols)}`"
