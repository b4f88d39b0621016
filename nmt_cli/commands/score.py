"""`nmt score`: sacreBLEU, chrF and TER with signatures, and the paper's tokenized BLEU;
with --trees, parses scored as EVALB scores them (COLLINS.prm)."""

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
    trees: bool = typer.Option(
        False, "--trees", help="Parses: EVALB (COLLINS.prm) F1 against gold trees."
    ),
    src: Path | None = typer.Option(
        None, "--src", help="--trees: HYP is linearized; these are its words."
    ),
    on_bad_utf8: str = on_bad_utf8_option(),
    quiet: bool = quiet_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Score hypotheses: sacreBLEU, chrF, TER, paper BLEU; or parse trees.

    Detokenized hypotheses against raw references, with sacreBLEU's defaults and
    signatures; the paper's tokenized BLEU beside them, labelled. With --trees, one
    bracketed tree a line against gold trees (a ptb data directory's test.tgt.txt):
    EVALB's labelled bracket F1 with COLLINS.prm, all sentences and those of at most 40
    words; --src SOURCE takes a model's linearized output instead, ill-formed ones
    repaired and counted.
    """
    from nmt_cli.engines.score import (
        PAPER_LABEL,
        ScoreSettings,
        check_settings,
        mostly_empty,
        score_lines,
    )

    verbosity = Verbosity(quiet, verbose)
    if trees or src is not None:
        _score_trees(hyp, ref, src, trees, as_json, on_bad_utf8, verbosity)
        return
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


def _score_trees(
    hyp: Path | None,
    ref: list[Path],
    src: Path | None,
    trees: bool,
    as_json: bool,
    on_bad_utf8: str,
    verbosity: Verbosity,
) -> None:
    """`nmt score --trees`: EVALB's summaries, the repairs, and the signature."""
    from nmt_cli.trees.scoring import score_trees

    with user_errors(verbosity.verbose):
        if not trees:
            raise UsageError("--src goes with --trees (it names the words of linearized trees)")
        if len(ref) != 1:
            raise UsageError(f"--trees takes one gold file (--ref), got {len(ref)}")
        decoder = LineDecoder(on_bad_utf8)
        hyp_name = display_name(hyp or "-")
        hyps = read_lines(hyp or "-", decoder)
        refs = read_lines(ref[0], decoder)
        words = read_lines(src, decoder) if src is not None else None
        if decoder.replaced:
            warn(decoder.warning())
        result = score_trees(hyps, refs, words, names=[hyp_name, str(ref[0]), str(src)])
        if as_json:
            record = dataclasses.asdict(result)
            record.pop("trees")
            typer.echo(json.dumps(record, indent=2, ensure_ascii=False))
            return
        for summary, scope in (
            (result.all, "all"),
            (result.short, f"length <= {result.cutoff_len}"),
        ):
            tags = summary.tagging_accuracy
            typer.echo(
                f"F1 ({scope}) = {summary.f1:.2f}  recall {summary.recall:.2f}, precision "
                f"{summary.precision:.2f}, complete match {summary.complete_match:.2f}, "
                f"tagging accuracy {'n/a' if tags is None else f'{tags:.2f}'}; "
                f"{summary.valid_sentences:,} of {summary.sentences:,} sentences"
            )
        typer.echo(f"  signature: {result.signature}")
        unscored = result.all.error_sentences + result.all.skip_sentences
        if unscored:
            warn(
                f"{unscored:,} sentence(s) not scored, as EVALB leaves them out: "
                f"{result.all.error_sentences:,} whose words differ from the gold tree's, "
                f"{result.all.skip_sentences:,} without any word"
            )
        if result.all.tagging_accuracy is None:
            info(
                "tagging accuracy n/a: the hypotheses carry no POS tags of their own "
                "(their leaves are XX or the words)",
                verbosity,
            )
        if result.repaired:
            rules = ", ".join(f"{rule} {n:,}" for rule, n in result.repairs.items())
            warn(f"{result.repaired:,} of {result.lines:,} hypotheses repaired ({rules})")
