"""`nmt score`: sacreBLEU, chrF and TER with signatures, and the paper's tokenized BLEU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from nmt_cli.commands.common import (
    Verbosity,
    err_console,
    info,
    on_bad_utf8_option,
    quiet_option,
    user_errors,
    verbose_option,
    warn,
)
from nmt_cli.commands.progress import CountProgress
from nmt_cli.errors import UsageError
from nmt_cli.text_io import LineDecoder, display_name, read_lines


def score(
    hyp: Path | None = typer.Argument(
        None, metavar="HYP", help="Hypotheses, one a line; default or -: stdin."
    ),
    ref: list[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeatable)."),
    paper: bool = typer.Option(
        True,
        "--paper/--no-paper",
        help="Also the paper's tokenized BLEU (default).",
        show_default=False,
    ),
    lang: str = typer.Option("de", "--lang", help="Moses tokenizer language for --paper."),
    bootstrap: int = typer.Option(0, "--bootstrap", help="Resamples for 95% CIs, e.g. 1000."),
    compare: Path | None = typer.Option(
        None, "--compare", help="A second system's output: paired significance test."
    ),
    test: str = typer.Option("bs", "--test", help="Paired test: bs (bootstrap) or ar."),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
    on_bad_utf8: str = on_bad_utf8_option(),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Score hypotheses: sacreBLEU, chrF, TER, paper BLEU.

    Detokenized hypotheses against raw references, with sacreBLEU's defaults and
    signatures; the paper's tokenized BLEU beside them, labelled.
    """
    from nmt_cli.engines.score import (
        PAPER_LABEL,
        ScoreSettings,
        check_settings,
        mostly_empty,
        score_lines,
    )

    verbosity = Verbosity(quiet, verbose)
    with user_errors(verbose):
        if test not in ("bs", "ar"):
            raise UsageError(f"--test {test!r}: use bs (paired bootstrap) or ar")
        settings = ScoreSettings(
            paper=paper, lang=lang, bootstrap=bootstrap, test="bs" if test == "bs" else "ar"
        )
        decoder = LineDecoder(on_bad_utf8)
        check_settings(settings)
        hyp_name = display_name(hyp or "-")
        hyps = read_lines(hyp or "-", decoder)
        other = read_lines(compare, decoder) if compare else None
        refs = [read_lines(r, decoder) for r in ref]
        if decoder.replaced:
            warn(decoder.warning())
        names = [hyp_name, *map(str, ref)]
        steps = 3 + int(paper) + int(compare is not None)
        slow = bool(bootstrap) or compare is not None
        with CountProgress(err_console, "score", steps, verbosity.progress and slow) as bar:
            result = score_lines(hyps, refs, settings, other, names, lambda m: bar.advance(1, m))
        for name, lines in ((hyp_name, hyps), (str(compare), other or [])):
            empty = mostly_empty(lines)
            if empty:
                warn(f"{name}: {empty:,} of {len(lines):,} lines are empty; is the system broken?")
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
        info(f"{result.lines:,} lines, {result.references} reference set(s)", verbosity)
