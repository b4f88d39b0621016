"""`nmt prepare`: a named corpus or local files -> vocabulary + binarized data directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from nmt_cli.commands.common import (
    Verbosity,
    err_console,
    on_bad_utf8_option,
    out_console,
    quiet_option,
    user_errors,
    verbose_option,
    warn,
)
from nmt_cli.errors import UsageError
from nmt_cli.outputs import check_output_dir

if TYPE_CHECKING:  # the engine loads numpy and sentencepiece: only when the command runs
    from nmt_cli.engines.prepare import PrepareResult


def prepare_command(
    corpus: str = typer.Argument(
        "", metavar="[PRESET]", help="demo, multi30k-en-de, wmt14-en-de, ... (--list)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Data directory to write."),
    source: str = typer.Option("", "--from", help="Text, Parquet/JSON or saved-dataset directory."),
    src: str = typer.Option("", "--src", help="Source language code, e.g. en."),
    tgt: str = typer.Option("", "--tgt", help="Target language code, e.g. de."),
    train_src: str = typer.Option("", "--train-src", help="Explicit training source file."),
    train_tgt: str = typer.Option("", "--train-tgt", help="Explicit training target file."),
    valid_src: str = typer.Option("", "--valid-src", help="Explicit dev source file."),
    valid_tgt: str = typer.Option("", "--valid-tgt", help="Explicit dev target file."),
    test_src: str = typer.Option("", "--test-src", help="Explicit test source file."),
    test_tgt: str = typer.Option("", "--test-tgt", help="Explicit test target file."),
    vocab_size: int = typer.Option(
        0,
        "--vocab-size",
        help="BPE size; default 0: the preset's, 8000 local.",
        show_default=False,
    ),
    joint_vocab: bool = typer.Option(
        True,
        "--joint-vocab/--separate-vocab",
        help="One BPE model for both sides (default).",
        show_default=False,
    ),
    max_len: int = typer.Option(250, "--max-len", help="Longest side, words; 0 = off."),
    max_len_ratio: float | None = typer.Option(
        None,
        "--max-len-ratio",
        help="Highest word ratio; 0 = off. 1.5, Multi30k 9.",
        show_default=False,
    ),
    dedup: bool = typer.Option(
        False, "--dedup", help="Drop repeated training pairs (16 B a pair)."
    ),
    normalize: bool = typer.Option(
        False, "--normalize-punctuation", help="Moses punctuation normalization (sacremoses)."
    ),
    max_pairs: int = typer.Option(0, "--max-pairs", help="Only N training pairs; 0 = all."),
    sample: bool = typer.Option(False, "--sample", help="With --max-pairs: a seeded sample of N."),
    valid_split: str = typer.Option(
        "", "--valid-split", help="Which dev set when there are several."
    ),
    test_split: str = typer.Option(
        "", "--test-split", help="Which test set, e.g. test_2016_flickr."
    ),
    seed: int = typer.Option(1, "--seed", help="Seed of prepare's samples."),
    on_bad_utf8: str = on_bad_utf8_option(),
    vocab_from: Path | None = typer.Option(
        None,
        "--vocab-from",
        metavar="CHECKPOINT",
        help="Fine-tuning: encode with a model's vocabulary.",
    ),
    vocab_sample_lines: int = typer.Option(
        1_000_000,
        "--vocab-sample-lines",
        help="Lines SentencePiece learns from; 1,000,000.",
        show_default=False,
    ),
    tree_leaves: str = typer.Option(
        "xx",
        "--tree-leaves",
        help="Leaves: xx (the paper's, default) or words.",
        show_default=False,
    ),
    cache_dir: str = typer.Option("", "--cache-dir", help="Download cache for presets."),
    workers: int = typer.Option(0, "--workers", help="Encoding processes; 0: all CPUs."),
    force: bool = typer.Option(False, "--force", help="Redo every stage, even finished ones."),
    list_: bool = typer.Option(False, "--list", help="List the presets and exit."),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Clean a corpus, learn a BPE vocabulary, binarize it.

    The data directory this writes is what `nmt train` reads (the recipe's data.dir).
    Rerunning skips finished stages; --force redoes them. One prepare at a time may
    write a data directory. Examples:

    \b
      nmt prepare demo
      nmt prepare multi30k-en-de                  # downloads, checks SHA-256
      nmt prepare multi30k-en-de --from DIR       # the same files, offline
      nmt prepare --from DIR --src en --tgt de --out data/mine
      nmt prepare --from DIR --src en --tgt de --vocab-from model.pt
    """  # fmt: skip
    from nmt_cli.commands.prepare_progress import StageProgress
    from nmt_cli.engines.prepare import PrepareConfig, prepare
    from nmt_cli.engines.prepare.presets import default_max_len_ratio

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        if list_:
            _print_presets()
            return
        files = [
            (split, a, b)
            for split, a, b in (
                ("train", train_src, train_tgt),
                ("valid", valid_src, valid_tgt),
                ("test", test_src, test_tgt),
            )
            if a or b
        ]
        for split, a, b in files:
            if not (a and b):
                raise UsageError(f"--{split}-src and --{split}-tgt go together; give both")
        if out is None:
            name = corpus or (f"{Path(source).name}-{src}-{tgt}" if source else f"{src}-{tgt}")
            out = Path("data") / name
        check_output_dir(out)
        if vocab_from is not None and (vocab_size or not joint_vocab):
            raise UsageError(
                "--vocab-from takes the model's own vocabulary: drop --vocab-size and "
                "--separate-vocab"
            )
        if max_len_ratio is None:
            max_len_ratio = default_max_len_ratio(corpus)
        cfg = PrepareConfig(
            out=str(out), preset=corpus, source=source, files=tuple(files), src=src, tgt=tgt,
            vocab_size=vocab_size, joint_vocab=joint_vocab, max_len=max_len,
            max_len_ratio=max_len_ratio, dedup=dedup, normalize_punctuation=normalize,
            max_pairs=max_pairs, sample_max_pairs=sample, valid_split=valid_split,
            test_split=test_split, seed=seed, on_bad_utf8=on_bad_utf8,
            vocab_sample_lines=vocab_sample_lines, cache_dir=cache_dir, workers=workers,
            force=force, vocab_from=str(vocab_from or ""), tree_leaves=tree_leaves,
        )  # fmt: skip
        with StageProgress(err_console, enabled=not verbosity.quiet) as progress:
            result = prepare(cfg, progress)
        if not verbosity.quiet:
            _print_summary(result)
        replaced = result.manifest["cleaning"]["bad_utf8_replaced"]
        if replaced and not result.up_to_date:
            warn(f"{replaced:,} line(s) with invalid UTF-8 or NUL bytes had them replaced")
        typer.echo(str(result.out))


def _print_presets() -> None:
    """The list is the command's result: on stdout, one row per preset, then the notes."""
    from nmt_cli.engines.prepare import list_presets

    table = Table(title="nmt prepare presets", box=box.SIMPLE_HEAD, pad_edge=False)
    rows = list_presets()
    columns = [c for c in rows[0] if c not in ("note", "source")]
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    out_console.print(table)
    for row in rows:
        out_console.print(
            f"[bold]{row['name']}[/] ({escape(row['source'])}): {escape(row['note'])}",
            highlight=False,
        )


def _print_summary(result: PrepareResult) -> None:
    m = result.manifest
    stages = Table(
        title=f"nmt prepare: {result.out}" + (" (up to date)" if result.up_to_date else "")
    )
    for column in ("stage", "status", "pairs", "seconds", "pairs/s"):
        stages.add_column(column, justify="left" if column in ("stage", "status") else "right")
    for r in result.stages:
        rate = f"{r.pairs / r.seconds:,.0f}" if r.ran and r.seconds > 0 and r.pairs else ""
        status = "done" if r.ran else "skipped"
        stages.add_row(
            r.stage,
            status,
            f"{r.pairs:,}" if r.ran else "",
            f"{r.seconds:.1f}" if r.ran else "",
            rate,
        )
    err_console.print(stages)
    splits = Table(title=f"{m['src']} -> {m['tgt']}, vocabulary {m['vocab']['size']:,} "
                   f"({'joint' if m['vocab']['joint'] else 'separate'} BPE)")  # fmt: skip
    for column in ("split", "pairs", "src tokens", "tgt tokens"):
        splits.add_column(column, justify="left" if column == "split" else "right")
    for name, c in m["splits"].items():
        splits.add_row(name, f"{c['pairs']:,}", f"{c['src_tokens']:,}", f"{c['tgt_tokens']:,}")
    err_console.print(splits)
    cleaning = m["cleaning"]["train"]
    dropped = ", ".join(f"{k} {v:,}" for k, v in cleaning["dropped"].items() if v) or "none"
    err_console.print(
        f"train: read {cleaning['read']:,}, kept {cleaning['kept']:,}; dropped: {dropped}"
    )
