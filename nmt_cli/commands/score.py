"""`nmt score`: sacreBLEU, chrF and TER with signatures, and the paper's tokenized BLEU."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import typer

from nmt_cli.commands.common import err_console, user_errors
from nmt_cli.engines.score import (
    PAPER_LABEL,
    ScoreSettings,
    read_lines,
    score_lines,
    split_lines,
)
from nmt_cli.errors import NmtError


def score(
    hyp: Path | None = typer.Argument(None, help="Hypotheses, one per line (default: stdin)."),
    ref: list[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeatable)."),
    paper: bool = typer.Option(
        True, "--paper/--no-paper", help="Also report the paper's tokenized BLEU (labelled)."
    ),
    lang: str = typer.Option("de", "--lang", help="Moses tokenizer language for --paper."),
    bootstrap: int = typer.Option(0, "--bootstrap", help="Resamples for 95% CIs (e.g. 1000)."),
    compare: Path | None = typer.Option(
        None, "--compare", help="A second system's output: paired significance test."
    ),
    test: str = typer.Option("bs", "--test", help="Paired test: bs (bootstrap) or ar."),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
) -> None:
    """Score detokenized hypotheses against raw references (sacreBLEU's defaults)."""
    with user_errors():
        if test not in ("bs", "ar"):
            raise NmtError(f"--test {test!r}: use bs (paired bootstrap) or ar")
        hyps = read_lines(hyp) if hyp else split_lines(sys.stdin.buffer.read(), "stdin")
        settings = ScoreSettings(
            paper=paper, lang=lang, bootstrap=bootstrap, test="bs" if test == "bs" else "ar"
        )
        other = read_lines(compare) if compare else None
        names = [str(hyp or "stdin"), *map(str, ref)]
        result = score_lines(hyps, [read_lines(r) for r in ref], settings, other, names)
        if as_json:
            typer.echo(json.dumps(dataclasses.asdict(result), indent=2, ensure_ascii=False))
            return
        for m in result.metrics:
            ci = f" (95% CI ± {m.ci:.2f}, mean {m.mean:.2f})" if m.ci is not None else ""
            typer.echo(f"{m.name} = {m.score:.2f}{ci}  {m.detail}".rstrip())
            typer.echo(f"  signature: {m.signature}")
            if m.name == "tokenized BLEU":
                typer.echo(f"  ({PAPER_LABEL})")
        for c in result.comparisons:
            typer.echo(
                f"{c.metric}: baseline {c.baseline:.2f} vs {compare} {c.other:.2f}, "
                f"p = {c.p_value:.4f} ({c.test})"
            )
        err_console.print(f"{result.lines:,} lines, {result.references} reference set(s)")
