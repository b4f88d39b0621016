"""`nmt attention`'s files: which pictures of a sentence's attention, under which names.

    encoder-layerL-lines.{png,svg}   Figures 3/4: layer L's self-attention, lines per head
    encoder-layerL-heads.{png,svg}   the same layer as one heatmap per head (Figure 5)
    decoder-self[-layerL][-headH]    decoder self-attention heatmaps, every layer x head
    cross[-layerL][-headH]           encoder-decoder attention heatmaps, likewise
    attention.html                   every map, switchable, in one self-contained page

Layer and head numbers are 1-based, as a person counts them (the paper's "layer 5 of 6").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt_cli.core.files import atomic_write_text
from nmt_cli.engines.pictures.attention_html import attention_page
from nmt_cli.engines.pictures.attention_plots import Panel, draw_heatmaps, draw_lines
from nmt_cli.engines.pictures.backend import (
    ATTENTION_FORMATS,
    IMAGE_FORMATS,
    check_out_dir,
    require_plotting,
    save_figure,
)
from nmt_cli.engines.translate.attention import AttentionMaps
from nmt_cli.engines.translate.views import check_layer
from nmt_cli.errors import NmtError

FORMATS = ATTENTION_FORMATS


@dataclass(frozen=True)
class AttentionPictureOptions:
    out_dir: Path
    encoder_layer: int  # 1-based, for the line and per-head pictures
    decoder_layer: int | None = None  # 1-based; None = every layer in a grid
    head: int | None = None  # 1-based; None = every head
    focus: str | None = None  # draw only the lines from this token (the encoder lines)
    formats: tuple[str, ...] = FORMATS

    def __post_init__(self) -> None:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise NmtError(
                f"--format {','.join(self.formats)}: use one or more of {', '.join(FORMATS)}"
            )


@dataclass(frozen=True)
class _Choice:
    """The options checked against the model, as 0-based indices."""

    encoder_layer: int
    decoder_layer: int | None
    head: int | None
    images: tuple[str, ...]


def check_picture_options(
    options: AttentionPictureOptions, encoder_layers: int, decoder_layers: int, heads: int
) -> _Choice:
    """Refuse layers and heads the model does not have, and image formats without
    matplotlib, before any translation is spent on pictures that cannot be drawn."""
    enc = check_layer(options.encoder_layer, encoder_layers, "--layer", "encoder")
    dec = None
    if options.decoder_layer is not None:
        dec = check_layer(options.decoder_layer, decoder_layers, "--decoder-layer", "decoder")
    head = None
    if options.head is not None:
        if not 1 <= options.head <= heads:
            raise NmtError(f"--head {options.head}: the model has {heads} heads; use 1 to {heads}")
        head = options.head - 1
    images = tuple(f for f in options.formats if f in IMAGE_FORMATS)
    if images:
        require_plotting(avoid="pass --format html for the page alone, which needs no matplotlib")
    return _Choice(enc, dec, head, images)


def write_attention_pictures(maps: AttentionMaps, options: AttentionPictureOptions) -> list[Path]:
    """Draw what `options` asks for into options.out_dir; returns the files written."""
    layers, heads = maps.encoder.shape[:2]
    choice = check_picture_options(options, layers, maps.decoder.shape[0], heads)
    focus = _focus(options.focus, maps.source)
    out = check_out_dir(options.out_dir)
    written: list[Path] = []
    if choice.images:
        written += _images(maps, out, choice, focus)
    if "html" in options.formats:
        page = out / "attention.html"
        atomic_write_text(page, attention_page(maps))
        written.append(page)
    return written


def _focus(token: str | None, tokens: Sequence[str]) -> list[int]:
    if token is None:
        return []
    found = [i for i, t in enumerate(tokens) if t == token or t.lstrip("\u2581") == token]
    if not found:
        raise NmtError(f"--focus {token!r}: not a token of the sentence ({' '.join(tokens)})")
    return found


def _images(maps: AttentionMaps, out: Path, choice: _Choice, focus: list[int]) -> list[Path]:
    enc, dec, head, formats = choice.encoder_layer, choice.decoder_layer, choice.head, choice.images
    enc_layers, heads = maps.encoder.shape[:2]
    chosen = [head] if head is not None else list(range(heads))
    where = f"layer {enc + 1} of {enc_layers}"
    written = []
    fig = draw_lines(
        maps.encoder[enc],
        maps.source,
        chosen,
        f"Encoder self-attention, {where}: line opacity is the weight",
        f"Tokens: {maps.unit_note}",
        focus,
    )
    written += save_figure(fig, out / f"encoder-layer{enc + 1}-lines", formats)
    panels = [Panel(f"head {h + 1}", maps.encoder[enc, h]) for h in chosen]
    fig = draw_heatmaps(
        panels,
        maps.source,
        maps.source,
        min(len(panels), 4),
        f"Encoder self-attention, {where}",
        f"Tokens: {maps.unit_note}",
        "attending token",
        "attended token",
    )
    written += save_figure(fig, out / f"encoder-layer{enc + 1}-heads", formats)
    suffix = (f"-layer{dec + 1}" if dec is not None else "") + (
        f"-head{head + 1}" if head is not None else ""
    )
    for name, title, weights, cols, col_label in (
        (
            "decoder-self",
            "Decoder self-attention",
            maps.decoder,
            maps.decoder_inputs,
            "decoder input (what the decoder was fed)",
        ),
        ("cross", "Encoder-decoder attention", maps.cross, maps.source, "source token"),
    ):
        panels = _grid(weights, dec, chosen)
        fig = draw_heatmaps(
            panels,
            maps.target,
            cols,
            len(chosen),
            f"{title}: {maps.source_text!r} -> {maps.translation!r}",
            f"Tokens: {maps.unit_note}",
            "generated token",
            col_label,
        )
        written += save_figure(fig, out / f"{name}{suffix}", formats)
    return written


def _grid(weights: np.ndarray, layer: int | None, heads: list[int]) -> list[Panel]:
    """Panels of `layer` (or every layer, one row each) x `heads`."""
    layers = [layer] if layer is not None else list(range(weights.shape[0]))
    return [Panel(f"layer {n + 1}, head {h + 1}", weights[n, h]) for n in layers for h in heads]
