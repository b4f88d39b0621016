"""Word alignments from cross-attention: exact on a model trained to reverse its input (the
truth is the anti-diagonal), and `nmt translate --alignment` output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli.cli import app
from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.alignment import (
    format_alignment,
    hard_alignment,
    merge_words,
    word_groups,
    word_labels,
)
from nmt_cli.engines.translate.translator import Translator
from tests.fixtures.translation_ckpt import ALIGN_UNSEEN, reverse_words

runner = CliRunner()
UNSEEN = ALIGN_UNSEEN  # not in ALIGN_POOL's order; the model generalises


pytestmark = [
    pytest.mark.slow,  # trains the models whose alignments it checks
    pytest.mark.usefixtures("one_thread"),
]


@pytest.fixture
def reverser(reverser_unseen: Path) -> Path:
    return reverser_unseen


def test_word_groups_follow_sentencepiece_word_starts() -> None:
    pieces = ["\u2581the", "\u2581", "m", "at", "\u2581s", "at", "</s>"]
    assert word_groups(pieces) == [0, 1, 1, 1, 2, 2, 3]
    assert word_labels(pieces) == ["the", "mat", "sat", "</s>"]
    assert word_groups(["<s>", "a", "\u2581b"]) == [0, 1, 2]


def test_word_groups_follow_bpe_continuation_marks() -> None:
    """subword-nmt's pieces (a fairseq import): a word goes on while a piece ends in "@@"."""
    pieces = ["the", "m@@", "a@@", "t", "sat", "</s>"]
    assert word_groups(pieces) == [0, 1, 1, 1, 2, 3]
    assert word_labels(pieces) == ["the", "mat", "sat", "</s>"]
    assert word_groups(["<s>", "a@@", "b", "c"]) == [0, 1, 1, 2]


def test_merging_sums_attention_to_a_word_and_averages_attention_from_it() -> None:
    rows = ["\u2581a", "b", "\u2581c"]  # words "ab", "c"
    cols = ["\u2581x", "y", "\u2581z"]  # words "xy", "z"
    weights = np.array([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0], [0.1, 0.1, 0.8]])
    merged = merge_words(weights, rows, cols)
    np.testing.assert_allclose(merged, [[(0.5 + 1.0) / 2, (0.5 + 0.0) / 2], [0.2, 0.8]])
    np.testing.assert_allclose(merged.sum(-1), 1.0)


def test_hard_alignment_links_each_target_word_to_its_strongest_source_word() -> None:
    src = ["\u2581a", "\u2581b", "</s>"]
    tgt = ["\u2581B", "\u2581A", "</s>"]
    cross = np.array([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.0, 0.0, 1.0]])
    assert format_alignment(hard_alignment(cross, src, tgt)) == "0-1 1-0"


def test_alignment_recovers_the_anti_diagonal_exactly(reverser: Path) -> None:
    translator = Translator.load(reverser, DecodeConfig(precision="fp32"), alignment_layer=1)
    for line, result in zip(UNSEEN, translator.translate(UNSEEN), strict=True):
        n = len(line.split())
        assert result.text == reverse_words(line)
        truth = sorted((i, n - 1 - i) for i in range(n))
        assert result.hypotheses[0].alignment == format_alignment(truth), line


def test_translate_alignment_in_plain_nbest_and_json_output(reverser: Path) -> None:
    text = "red dog sat\n\nthe cat\n"
    base = runner.invoke(app, ["translate", "-m", str(reverser), "-q"], input=text)
    plain = runner.invoke(app, ["translate", "-m", str(reverser), "-q", "--alignment"], input=text)
    assert plain.exit_code == 0, plain.stderr
    assert plain.stdout.splitlines() == [
        "sat dog red ||| 0-2 1-1 2-0",
        " ||| ",
        "cat the ||| 0-1 1-0",
    ]
    # Recording the attention changes nothing in the translations.
    assert [
        line.split(" ||| ")[0] for line in plain.stdout.splitlines()
    ] == base.stdout.splitlines()
    greedy = runner.invoke(
        app, ["translate", "-m", str(reverser), "-q", "--beam", "1", "--alignment"], input=text
    )
    assert greedy.stdout == plain.stdout
    nbest = runner.invoke(
        app, ["translate", "-m", str(reverser), "-q", "--nbest", "2", "--alignment-layer", "1"],
        input="the cat\n",
    )  # fmt: skip
    first = nbest.stdout.splitlines()[0].split(" ||| ")
    assert first[0] == "0" and first[1] == "cat the" and first[4] == "0-1 1-0"
    as_json = runner.invoke(
        app, ["translate", "-m", str(reverser), "-q", "--json", "--alignment"], input=text
    )
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert records[0]["hypotheses"][0]["alignment"] == "0-2 1-1 2-0"
    assert records[1]["hypotheses"] == []


def test_alignment_layer_out_of_range_is_one_line(reverser: Path) -> None:
    result = runner.invoke(
        app, ["translate", "-m", str(reverser), "--alignment-layer", "2"], input="the cat\n"
    )
    line = one_error(result, 1)
    assert result.stderr.strip().splitlines() == [line]
    assert line == "error: --alignment-layer 2: the model has 1 decoder layer(s); use 1 to 1"
