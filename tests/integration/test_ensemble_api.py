"""Ensembles and the Python API: an ensemble is searched like one model, its scores are
the average of its members' log-probabilities, and `nmt_cli.Translator` is what the CLI
runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner
from unix_helpers import one_error

from nmt_cli import DecodeConfig, Translator
from nmt_cli.cli import app
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.ensemble import Ensemble
from nmt_cli.core.search import Hypothesis, beam_search
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.errors import NmtError
from tests.fixtures.translation_ckpt import (
    COPY_POOL,
    random_checkpoint,
    sentences,
    separate_vocab,
    tiny_vocab,
)

runner = CliRunner()


@pytest.fixture(scope="module")
def vocab_models(tmp_path_factory: pytest.TempPathFactory, copy_model: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ens")
    vocab = tiny_vocab()
    return {
        "a": random_checkpoint(root / "a.pt", vocab, seed=1),
        "b": random_checkpoint(root / "b.pt", vocab, seed=2, d_model=48),  # another shape
        "copy": copy_model,
        "separate": random_checkpoint(root / "sep.pt", separate_vocab(), seed=3),
    }


def batch(lines: list[str], path: Path) -> torch.Tensor:
    ids = load_checkpoint(path).vocab.src.encode(lines)
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD_ID)
    for row, x in enumerate(ids):
        src[row, : len(x) + 1] = torch.tensor([*x, EOS_ID])
    return src


def search(model: Transformer | Ensemble, src: torch.Tensor) -> list[list[Hypothesis]]:
    return beam_search(model, src, beam_size=4, max_len_b=8, nbest=3)


def as_tuples(results: list[list[Hypothesis]]) -> list[list[tuple[list[int], float, float]]]:
    return [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in results]


def teacher_forced(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    with torch.no_grad():
        logits = model(src[None], torch.tensor([[BOS_ID, *tokens]])).float()
    target = torch.tensor([*tokens, EOS_ID])
    return float(F.log_softmax(logits[0], -1)[torch.arange(len(target)), target].sum())


def test_ensemble_of_one_is_the_model(vocab_models: dict[str, Path]) -> None:
    model = load_checkpoint(vocab_models["a"]).build_model()
    src = batch(sentences(6, seed=4), vocab_models["a"])
    assert as_tuples(search(Ensemble([model]), src)) == as_tuples(search(model, src))


def test_ensemble_of_two_identical_models_is_the_model(vocab_models: dict[str, Path]) -> None:
    ckpt = load_checkpoint(vocab_models["a"])
    model = ckpt.build_model()
    src = batch(sentences(6, seed=4), vocab_models["a"])
    twins = Ensemble([ckpt.build_model(), ckpt.build_model()])
    assert as_tuples(search(twins, src)) == as_tuples(search(model, src))


def test_ensemble_scores_average_the_members_log_probabilities(
    vocab_models: dict[str, Path],
) -> None:
    a = load_checkpoint(vocab_models["a"]).build_model()
    b = load_checkpoint(vocab_models["b"]).build_model()
    src = batch(sentences(5, seed=6), vocab_models["a"])
    results = search(Ensemble([a, b]), src)
    checked = 0
    for row, hyps in enumerate(results):
        for hyp in hyps:
            mean = (
                teacher_forced(a, src[row], hyp.tokens) + teacher_forced(b, src[row], hyp.tokens)
            ) / 2
            assert hyp.log_prob == pytest.approx(mean, abs=1e-4)
            checked += 1
    assert checked == 15
    # and the ensemble is not just one of its members
    assert as_tuples(results) != as_tuples(search(a, src))


def test_cli_ensemble_has_nbest_and_json_like_one_model(vocab_models: dict[str, Path]) -> None:
    copy = str(vocab_models["copy"])
    text = "\n".join([*COPY_POOL[:5], "", COPY_POOL[6]]) + "\n"
    one = runner.invoke(app, ["translate", "-m", copy, "--json", "--nbest", "2"], input=text)
    two = runner.invoke(
        app, ["translate", "-m", copy, "-m", copy, "--json", "--nbest", "2"], input=text
    )
    assert one.exit_code == 0 and two.exit_code == 0, two.stderr
    first = [json.loads(line) for line in one.stdout.splitlines()]
    second = [json.loads(line) for line in two.stdout.splitlines()]
    for x, y in zip(first, second, strict=True):
        assert [h["text"] for h in x["hypotheses"]] == [h["text"] for h in y["hypotheses"]]
        for hx, hy in zip(x["hypotheses"], y["hypotheses"], strict=True):
            assert hy["score"] == pytest.approx(hx["score"], abs=1e-4)
    assert [r["hypotheses"][0]["text"] for r in second if r["hypotheses"]] == [
        *COPY_POOL[:5],
        COPY_POOL[6],
    ]


def test_ensemble_of_different_vocabularies_is_refused_in_one_line(
    vocab_models: dict[str, Path],
) -> None:
    args = ["translate", "-m", str(vocab_models["a"]), "-m", str(vocab_models["separate"])]
    result = runner.invoke(app, args, input="the cat\n")
    line = one_error(result, 1, "sep.pt: cannot ensemble with")
    assert "target vocabularies differ (48 vs 44 pieces)" in line
    assert result.stderr.strip().splitlines() == [line]
    with pytest.raises(NmtError, match="target vocabularies differ"):
        Translator.load([vocab_models["a"], vocab_models["separate"]])


def test_python_api_translates_lists_iterators_and_strings(vocab_models: dict[str, Path]) -> None:
    translator = Translator.load(vocab_models["copy"], precision="fp32", nbest=2, buffer_lines=3)
    results = translator.translate(COPY_POOL[:7])
    assert [r.text for r in results] == COPY_POOL[:7]
    assert all(len(r.hypotheses) == 2 for r in results)
    assert [r.text for r in translator.translate_iter(iter(COPY_POOL[:7]))] == COPY_POOL[:7]
    [single] = translator.translate("the red cat")
    assert single.text == "the red cat" and single.hypotheses[0].log_prob < 0
    assert translator.config == DecodeConfig(precision="fp32", nbest=2, buffer_lines=3)
    with pytest.raises(TypeError, match="beam"):
        Translator.load(vocab_models["copy"], beam=4)


def test_python_api_equals_the_cli(vocab_models: dict[str, Path]) -> None:
    lines = sentences(12, seed=8)
    path = str(vocab_models["a"])
    cli = runner.invoke(
        app, ["translate", "-m", path, "--max-len-b", "6", "-q"], input="\n".join(lines) + "\n"
    )
    api = Translator.load(path, max_len_b=6).translate(lines)
    assert cli.stdout.splitlines() == [r.text for r in api]


def test_python_api_attention_rows_are_distributions(vocab_models: dict[str, Path]) -> None:
    translator = Translator.load(
        [vocab_models["copy"], vocab_models["copy"]], precision="fp32", nbest=2
    )
    [result] = translator.translate(["the red cat"], attention=True)
    for hyp in result.hypotheses:
        attention = hyp.attention
        assert attention is not None
        assert attention.target[-1] == "</s>" and attention.source[-1] == "</s>"
        assert len(attention.weights) == len(attention.target) == hyp.length + 1
        for row in attention.weights:
            assert len(row) == len(attention.source)
            assert sum(row) == pytest.approx(1.0, abs=1e-4)
    assert translator.translate(["the red cat"])[0].hypotheses[0].attention is None


def test_readme_python_example_runs(
    vocab_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Python API") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n\n")]
    assert "from nmt_cli import Translator" in code
    (tmp_path / "test.en").write_text("the red cat\na dog\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('"avg.pt"', repr(str(vocab_models["copy"]))), "README", "exec"), {})


def test_ensemble_attention_averages_members_recorded_by_search(
    vocab_models: dict[str, Path], tmp_path: Path
) -> None:
    """Attention of an ensemble comes from main's recording (the search's own weights),
    averaged over members; it leaves the translations unchanged."""
    paths = [vocab_models["copy"], vocab_models["b"]]
    translator = Translator.load(paths, precision="fp32", nbest=2, max_len_b=8)
    lines = ["the red cat", "a dog"]
    plain = translator.translate(lines)
    recorded = translator.translate(lines, attention=True)
    for p, r in zip(plain, recorded, strict=True):
        assert [h.text for h in p.hypotheses] == [h.text for h in r.hypotheses]
        for hyp in r.hypotheses:
            assert hyp.attention is not None
            assert len(hyp.attention.weights) == hyp.length + 1
            for row in hyp.attention.weights:
                assert sum(row) == pytest.approx(1.0, abs=1e-4)
    aligned = Translator.load(paths, precision="fp32", alignment_layer=0).translate(lines)
    assert all(r.hypotheses[0].alignment is not None for r in aligned)
    other = random_checkpoint(tmp_path / "heads.pt", tiny_vocab(), seed=4, n_heads=4)
    mixed = Translator.load([vocab_models["a"], other], precision="fp32")
    # decoding needs no common shape: the members' search, done here by core alone
    members = [load_checkpoint(p).build_model() for p in (vocab_models["a"], other)]
    reference = [hyps[0] for hyps in beam_search(Ensemble(members), batch(lines, other))]
    decoded = mixed.translate(lines)
    tgt = load_checkpoint(other).vocab.tgt
    assert [r.text for r in decoded] == [tgt.decode(h.tokens) for h in reference]
    assert [r.hypotheses[0].log_prob for r in decoded] == pytest.approx(
        [h.log_prob for h in reference], abs=1e-4
    )
    with pytest.raises(NmtError, match="same decoder layers and heads"):
        mixed.translate(lines, attention=True)
