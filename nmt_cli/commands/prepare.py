"""`nmt prepare`: a named corpus or local files -> vocabulary + binarized data directory."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from nmt_cli.commands.common import err_console, user_errors
from nmt_cli.commands.prepare_progress import StageProgress
from nmt_cli.engines.prepare import PrepareConfig, PrepareResult, list_presets, prepare
from nmt_cli.errors import NmtError


def prepare_command(
    corpus: str = typer.Argument("", help="A preset: demo, wmt14-en-de, ... (see --list)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Data directory to write."),
    source: str = typer.Option(
        "", "--from", help="Directory of text, Parquet/JSON or a saved dataset."
    ),
    src: str = typer.Option("", "--src", help="Source language code (e.g. en)."),
    tgt: str = typer.Option("", "--tgt", help="Target language code (e.g. de)."),
    train_src: str = typer.Option("", "--train-src", help="Explicit training source file."),
    train_tgt: str = typer.Option("", "--train-tgt", help="Explicit training target file."),
    valid_src: str = typer.Option("", "--valid-src", help="Explicit dev source file."),
    valid_tgt: str = typer.Option("", "--valid-tgt", help="Explicit dev target file."),
    test_src: str = typer.Option("", "--test-src", help="Explicit test source file."),
    test_tgt: str = typer.Option("", "--test-tgt", help="Explicit test target file."),
    vocab_size: int = typer.Option(
        0, "--vocab-size", help="BPE size; 0 = the preset's (8000 for local data)."
    ),
    joint_vocab: bool = typer.Option(
        True, "--joint-vocab/--separate-vocab", help="One BPE model for both sides."
    ),
    max_len: int = typer.Option(
        250, "--max-len", help="Drop training pairs with a side over N words (0 = off)."
    ),
    max_len_ratio: float = typer.Option(
        1.5, "--max-len-ratio", help="Drop pairs whose word-count ratio exceeds R (0 = off)."
    ),
    dedup: bool = typer.Option(
        False, "--dedup", help="Drop repeated training pairs (16 bytes of memory per pair)."
    ),
    normalize: bool = typer.Option(
        False, "--normalize-punctuation", help="Moses punctuation normalization (sacremoses)."
    ),
    max_pairs: int = typer.Option(0, "--max-pairs", help="Use only N training pairs (0 = all)."),
    sample: bool = typer.Option(
        False, "--sample", help="With --max-pairs: a seeded sample, not the first N."
    ),
    valid_split: str = typer.Option(
        "", "--valid-split", help="Which dev set when there are several."
    ),
    test_split: str = typer.Option(
        "", "--test-split", help="Which test set, e.g. test_2016_flickr."
    ),
    seed: int = typer.Option(1, "--seed", help="Seed of every sample prepare takes."),
    on_bad_utf8: str = typer.Option("error", "--on-bad-utf8", help="error | replace (and count)."),
    vocab_sample_lines: int = typer.Option(
        1_000_000, "--vocab-sample-lines", help="Lines SentencePiece trains on, at most."
    ),
    cache_dir: str = typer.Option("", "--cache-dir", help="datasets cache directory for presets."),
    workers: int = typer.Option(0, "--workers", help="Encoding processes (0 = one per core)."),
    force: bool = typer.Option(False, "--force", help="Redo every stage, even finished ones."),
    list_: bool = typer.Option(False, "--list", help="List the presets and exit."),
) -> None:
    """Clean a corpus, train a SentencePiece BPE vocabulary and binarize it for training.

    Rerunning skips finished stages; --force redoes them. Examples: `nmt prepare demo`,
    `nmt prepare --from ../shared/data/multi30k --src en --tgt de --out data/m30k-en-de`.
    """  # fmt: skip
    with user_errors():
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
                raise NmtError(f"--{split}-src and --{split}-tgt go together; give both")
        if out is None:
            name = corpus or (f"{Path(source).name}-{src}-{tgt}" if source else f"{src}-{tgt}")
            out = Path("data") / name
        cfg = PrepareConfig(
            out=str(out), preset=corpus, source=source, files=tuple(files), src=src, tgt=tgt,
            vocab_size=vocab_size, joint_vocab=joint_vocab, max_len=max_len,
            max_len_ratio=max_len_ratio, dedup=dedup, normalize_punctuation=normalize,
            max_pairs=max_pairs, sample_max_pairs=sample, valid_split=valid_split,
            test_split=test_split, seed=seed, on_bad_utf8=on_bad_utf8,
            vocab_sample_lines=vocab_sample_lines, cache_dir=cache_dir, workers=workers,
            force=force,
        )  # fmt: skip
        with StageProgress(err_console) as progress:
            result = prepare(cfg, progress)
        _print_summary(result)
        typer.echo(str(result.out))


def _print_presets() -> None:
    table = Table(title="nmt prepare presets")
    rows = list_presets()
    columns = [c for c in rows[0] if c != "note"]
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    err_console.print(table)
    for row in rows:
        err_console.print(f"[bold]{row['name']}[/]: {row['note']}", highlight=False)


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
    if m["cleaning"]["bad_utf8_replaced"]:
        err_console.print(f"lines with bad UTF-8 replaced: {m['cleaning']['bad_utf8_replaced']:,}")
