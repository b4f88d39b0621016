"""`nmt export`: a checkpoint as a CTranslate2 or Hugging Face transformers model."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from nmt_cli.commands.common import Verbosity, info, quiet_option, user_errors, verbose_option


class Target(StrEnum):
    ctranslate2 = "ctranslate2"
    huggingface = "huggingface"


def export(
    checkpoint: Path = typer.Argument(
        ..., metavar="CHECKPOINT", help="Checkpoint (.pt) to export."
    ),
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="Model directory to create."),
    to: Target = typer.Option(
        ..., "--to", metavar="TARGET", help="ctranslate2 or huggingface (MarianMT)."
    ),
    quantization: str = typer.Option(
        "float32",
        "--quantization",
        metavar="TYPE",
        help="CTranslate2 weights, see below; default float32.",
        show_default=False,
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT_DIR if it is not empty."),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Export a checkpoint for serving: CTranslate2, or transformers' MarianMT.

    The directory holds the model, its SentencePiece models (source.spm,
    target.spm) and vocabularies; README.md shows how to load each. It appears
    whole or not at all.

    \b
    --quantization (CTranslate2 only): float32, int8, int8_float32,
    int8_float16, int8_bfloat16, int16, float16 or bfloat16.
    """
    from nmt_cli.engines.export.run import ExportConfig, export_model

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        cfg = ExportConfig(checkpoint, out_dir, to.value, quantization, force)
        result = export_model(cfg)
        info(
            f"exported {checkpoint} to {result.out_dir} ({to.value}; "
            f"{'shared' if result.shared_vocab else 'separate'} embeddings): "
            f"{', '.join(result.files)}",
            verbosity,
        )
