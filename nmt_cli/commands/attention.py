"""`nmt attention`: pictures of the attention of one sentence and its translation."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.common import Verbosity, info, quiet_option, user_errors, verbose_option
from nmt_cli.config import LENGTH_PENALTY_HELP, DecodeConfig
from nmt_cli.engines.pictures.backend import ATTENTION_FORMATS
from nmt_cli.errors import NmtError

_D = DecodeConfig()  # the defaults: the paper's decoding settings (section 6.1)


def attention(
    sentence: str = typer.Argument(..., help="The source sentence (raw text)."),
    model: Path = typer.Option(..., "--model", "-m", help="Checkpoint (.pt) to translate with."),
    out: Path = typer.Option(Path("attention"), "--out", "-o", help="Directory for the files."),
    layer: int = typer.Option(
        0,
        "--layer",
        help="Encoder layer (1-based) to draw; 0 = the penultimate (the paper shows 5 of 6).",
    ),
    decoder_layer: int = typer.Option(
        0, "--decoder-layer", help="Decoder layer (1-based) for the heatmaps; 0 = all, a grid."
    ),
    head: int = typer.Option(0, "--head", help="Head (1-based) to draw; 0 = every head."),
    words: bool = typer.Option(
        False,
        "--words",
        help="Merge SentencePiece pieces into words: attention to a word sums its pieces, "
        "attention from a word averages them (the legend says so).",
    ),
    focus: str | None = typer.Option(
        None,
        "--focus",
        help="Draw only the encoder lines from this token (as Figure 3 does for 'making').",
    ),
    formats: str = typer.Option(
        ",".join(ATTENTION_FORMATS), "--format", help="Comma-separated: png, svg, html."
    ),
    beam: int = typer.Option(_D.beam_size, "--beam", help="Beam size of the translation drawn."),
    alpha: float = typer.Option(_D.length_penalty, "--alpha", help=LENGTH_PENALTY_HELP + "."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Draw the attention of SENTENCE and its translation.

    Encoder self-attention of one layer as the paper's Figures 3-5 (lines, one colour per
    head, and per-head heatmaps), decoder self-attention and encoder-decoder attention of
    the model's own translation (beam search) as heatmaps of every layer and head, and one
    HTML page to browse them all. The weights are recorded by the search that translates.
    """
    from nmt_cli.core.checkpoint import load_checkpoint
    from nmt_cli.engines.pictures.attention_files import (
        AttentionPictureOptions,
        check_picture_options,
        write_attention_pictures,
    )
    from nmt_cli.engines.pictures.backend import check_out_dir
    from nmt_cli.engines.translate.attention import record_attention
    from nmt_cli.engines.translate.translator import Translator
    from nmt_cli.engines.translate.views import default_layer

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        try:
            cfg = DecodeConfig(
                beam_size=beam, length_penalty=alpha, precision="fp32", device=device
            )
        except ValueError as exc:
            raise NmtError(str(exc).replace("decode.", "--")) from None
        ckpt = load_checkpoint(model)
        options = AttentionPictureOptions(
            out_dir=out,
            encoder_layer=layer or default_layer(ckpt.model_config.encoder_layers),
            decoder_layer=decoder_layer or None,
            head=head or None,
            focus=focus,
            formats=tuple(f.strip().lower() for f in formats.split(",") if f.strip()),
        )
        shape = ckpt.model_config
        check_picture_options(options, shape.encoder_layers, shape.decoder_layers, shape.n_heads)
        check_out_dir(out)
        translator = Translator.from_checkpoint(ckpt, cfg)
        maps = record_attention(translator, sentence)
        if words:
            maps = maps.merged()
        written = write_attention_pictures(maps, options)
        info(
            f"{sentence!r} -> {maps.translation!r}\nwrote {len(written)} files to {out}", verbosity
        )
        for path in written:
            typer.echo(path)
