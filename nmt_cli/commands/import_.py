"""`nmt import`: a MarianMT (OPUS-MT) or fairseq model as an nmt checkpoint."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from nmt_cli.commands.common import Verbosity, info, quiet_option, user_errors, verbose_option


class Source(StrEnum):
    huggingface = "huggingface"
    fairseq = "fairseq"


def import_command(
    path: Path = typer.Argument(
        ..., metavar="MODEL", help="MarianMT directory, or fairseq checkpoint (.pt)."
    ),
    source: Source = typer.Option(
        ..., "--from", metavar="SOURCE", help="huggingface (MarianMT) or fairseq."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Checkpoint (.pt) to write."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", metavar="DIR", help="fairseq: the directory of its dict.*.txt."
    ),
    src_lang: str = typer.Option("", "--src", metavar="LANG", help="Source language code."),
    tgt_lang: str = typer.Option("", "--tgt", metavar="LANG", help="Target language code."),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Import a model trained elsewhere as an nmt checkpoint.

    The checkpoint translates, serves, exports, averages and fine-tunes
    (train.init_from) like one nmt trained; it records where it came from.
    Every difference from nmt's Transformer is mapped exactly or refused by name;
    the mapped ones are listed as notes.

    \b
    nmt import --from huggingface opus-mt-en-de/ -o en-de.pt
    nmt import --from fairseq wmt16/model.pt --data-dir wmt16 -o en-de.pt
    """
    from nmt_cli.engines.importing.run import ImportConfig, import_model

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        cfg = ImportConfig(source.value, path, output, src_lang, tgt_lang, data_dir)
        result = import_model(cfg)
        m = result.model_config
        vocab = (
            f"one vocabulary of {m.tgt_vocab_size:,}"
            if result.joint_vocab
            else f"vocabularies of {m.src_vocab_size:,} / {m.tgt_vocab_size:,}"
        )
        for note in result.notes:
            info(f"note: {note}", verbosity)
        info(
            f"imported {path} ({source.value}: {m.encoder_layers}+{m.decoder_layers} layers, "
            f"d_model {m.d_model}, {m.n_heads} heads, d_ff {m.d_ff}, {m.activation}, {vocab}) "
            f"-> {result.output}",
            verbosity,
        )
        typer.echo(str(result.output))
