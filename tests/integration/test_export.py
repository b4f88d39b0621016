"""`nmt export`: the exported CTranslate2 and transformers models decode like `nmt translate`.

A model trained here for a few seconds (and a random one with separate vocabularies) is
exported through the CLI and loaded with the real libraries; greedy decoding must give
the same tokens and, within 1e-3, the same log-probabilities as nmt's own search.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner
from unix_helpers import no_escape, sole_error

from nmt_cli.cli import app
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint
from nmt_cli.core.search import greedy_search
from nmt_cli.core.transformer import Transformer, sinusoidal_positions
from nmt_cli.core.vocab import EOS_ID, PAD_ID
from nmt_cli.engines.export.huggingface import marian_permutation
from tests.fixtures.translation_ckpt import (
    COPY_POOL,
    copy_checkpoint,
    sentences,
    separate_vocab,
    tiny_vocab,
)

pytestmark = pytest.mark.slow  # exports, then decodes in CTranslate2 and transformers

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")

runner = CliRunner()
# The copy model's 44 lines and 6 it never saw: 50 test sentences it translates with
# confidence (on many unseen lines a model this small babbles, and the argmax of a babble
# can flip with the summation order of any two implementations, nmt's batched and
# unbatched search included).
LINES = [*COPY_POOL, *sentences(46, seed=5)[40:]]
# Output tokens before the end is forced, the same for every decoder compared.
MAX_OUT = 30


def export(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["export", *args])
    no_escape(result)
    return result.exit_code, result.stderr


@pytest.fixture
def trained(copy_model: Path) -> Path:
    return copy_model


@pytest.fixture(scope="module")
def pre_norm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pre") / "pre.pt"
    return copy_checkpoint(path, tiny_vocab(), steps=150, pre_norm=True)


@pytest.fixture(scope="module")
def separate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sep") / "sep.pt"
    return copy_checkpoint(path, separate_vocab(), steps=150)


def nmt_greedy(ckpt: Checkpoint, lines: list[str]) -> list[tuple[list[int], float]]:
    """nmt's own greedy decoding in fp32: (tokens, log-probability including EOS), at most
    MAX_OUT tokens before the end is forced."""
    model = ckpt.build_model()
    out = []
    for ids in ckpt.vocab.src.encode(lines):
        [hyp] = greedy_search(model, torch.tensor([[*ids, EOS_ID]]), 0.0, MAX_OUT)[0]
        out.append((hyp.tokens, hyp.log_prob))
    return out


def ct2_greedy(model_dir: Path, lines: list[str]) -> list[tuple[list[int], float]]:
    import sentencepiece as spm

    source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type="float32")
    results = translator.translate_batch(
        source.encode(lines, out_type=str),
        beam_size=1,
        min_decoding_length=0,
        length_penalty=0.0,  # the score is then the plain log-probability
        return_scores=True,
        max_decoding_length=MAX_OUT,
    )
    return [([target.PieceToId(p) for p in r.hypotheses[0]], r.scores[0]) for r in results]


def hf_greedy(model_dir: Path, lines: list[str]) -> tuple[list[tuple[list[int], float]], list[str]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        gen = model.generate(
            **batch,
            num_beams=1,
            do_sample=False,
            max_new_tokens=MAX_OUT + 1,  # the last one a forced EOS, as nmt's
            output_logits=True,
            return_dict_in_generate=True,
        )
    logprobs = torch.stack(gen.logits, 1).float().log_softmax(-1)  # raw, before masking
    out = []
    for row, seq in enumerate(gen.sequences[:, 1:].tolist()):
        end = seq.index(EOS_ID) + 1
        lp = logprobs[row, torch.arange(end), seq[:end]].sum()
        out.append((seq[: end - 1], float(lp)))
    texts = tokenizer.batch_decode(gen.sequences, skip_special_tokens=True)
    return out, texts


def assert_same(
    ours: list[tuple[list[int], float]], theirs: list[tuple[list[int], float]], cut: bool = False
) -> None:
    """Same tokens, same log-probabilities within 1e-3. With `cut` (CTranslate2, which stops
    at its length limit without an EOS) the score of an output nmt ended by force is not
    comparable, so only naturally ended outputs are compared, and most must be."""
    assert [t for t, _ in theirs] == [t for t, _ in ours]
    compared = 0
    for (tokens, ours_lp), (_, their_lp) in zip(ours, theirs, strict=True):
        if cut and len(tokens) == MAX_OUT:
            continue
        assert their_lp == pytest.approx(ours_lp, abs=1e-3)
        compared += 1
    assert compared >= 0.8 * len(ours)


def nmt_translate_texts(ckpt_path: Path, lines: list[str]) -> list[str]:
    text = "\n".join(lines) + "\n"
    result = runner.invoke(
        app,
        ["translate", "-m", str(ckpt_path), "--beam", "1", "--precision", "fp32", "-q"],
        input=text,
    )
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()


def test_ctranslate2_decodes_like_nmt(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "ct2"
    code, err = export("--to", "ctranslate2", str(trained), str(out))
    assert code == 0, err
    files = {p.name for p in out.iterdir()}
    assert {
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "source.spm",
        "target.spm",
    } <= files
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5)
    ckpt = load_checkpoint(trained)
    ours, theirs = nmt_greedy(ckpt, LINES), ct2_greedy(out, LINES)
    assert_same(ours, theirs, cut=True)
    # and `nmt translate --beam 1` prints exactly those token sequences, detokenized
    assert nmt_translate_texts(trained, LINES) == [ckpt.vocab.tgt.decode(t) for t, _ in theirs]
    assert sum(len(t) for t, _ in ours) > 3 * len(LINES)  # real output, not empty lines


def test_ctranslate2_int8_export_loads_and_translates(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "ct2-int8"
    code, err = export("--to", "ctranslate2", "--quantization", "int8", str(trained), str(out))
    assert code == 0, err
    # the weights are stored as 8-bit integers, and the copy model still copies its lines
    assert ctranslate2.Translator(str(out), device="cpu").compute_type.startswith("int8")
    ckpt = load_checkpoint(trained)
    theirs = ct2_greedy(out, LINES[:5])
    assert [t for t, _ in theirs] == [t for t, _ in nmt_greedy(ckpt, LINES[:5])]
    assert [ckpt.vocab.tgt.decode(t) for t, _ in theirs] == LINES[:5]


def test_huggingface_decodes_like_nmt(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    code, err = export("--to", "huggingface", str(trained), str(out))
    assert code == 0, err
    files = {p.name for p in out.iterdir()}
    tokenizer_files = {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json"}
    assert tokenizer_files | {"config.json", "generation_config.json"} <= files
    config = json.loads((out / "config.json").read_text())
    assert config["decoder_start_token_id"] == 2 and config["scale_embedding"] is True
    assert config["activation_function"] == "relu" and config["pad_token_id"] == PAD_ID
    ckpt = load_checkpoint(trained)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out))
    assert not model.final_logits_bias.any()
    # Marian rebuilds its sinusoids on load (sin half, cos half); the export permuted the
    # model's coordinates so that this table is exactly ours, reordered.
    cfg = ckpt.model_config
    table = sinusoidal_positions(cfg.max_positions, cfg.d_model)[:, marian_permutation(cfg.d_model)]
    for side in (model.model.encoder, model.model.decoder):
        assert torch.allclose(side.embed_positions.weight, table, atol=1e-6)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer(LINES[:3])["input_ids"] == [
        [*ids, EOS_ID] for ids in ckpt.vocab.src.encode(LINES[:3])
    ]
    ours = nmt_greedy(ckpt, LINES)
    theirs, texts = hf_greedy(out, LINES)
    assert_same(ours, theirs)
    assert texts == nmt_translate_texts(trained, LINES)


def test_separate_vocabularies_export_to_both(separate: Path, tmp_path: Path) -> None:
    ckpt = load_checkpoint(separate)
    assert not ckpt.vocab.joint and not ckpt.model_config.three_way_tying
    lines = LINES[:10]
    ours = nmt_greedy(ckpt, lines)
    ct2_dir, hf_dir = tmp_path / "ct2", tmp_path / "hf"
    assert export("--to", "ctranslate2", str(separate), str(ct2_dir))[0] == 0
    assert {"source_vocabulary.json", "target_vocabulary.json"} <= {
        p.name for p in ct2_dir.iterdir()
    }
    assert_same(ours, ct2_greedy(ct2_dir, lines), cut=True)
    assert export("--to", "huggingface", str(separate), str(hf_dir))[0] == 0
    assert (hf_dir / "target_vocab.json").is_file()
    theirs, texts = hf_greedy(hf_dir, lines)
    assert_same(ours, theirs)
    assert texts == [ckpt.vocab.tgt.decode(t) for t, _ in ours]


def test_learned_positions_go_to_ctranslate2_but_not_to_marian(
    trained: Path, tmp_path: Path
) -> None:
    """The trained model turned into one with learned positions (its sinusoids plus noise,
    so that CTranslate2's own table would score differently): CTranslate2 takes them,
    MarianMT cannot hold them and is refused."""
    ckpt = load_checkpoint(trained)
    cfg = dataclasses.replace(ckpt.model_config, positions="learned")
    model = Transformer(cfg)
    weights = dict(ckpt.model)
    gen = torch.Generator().manual_seed(0)
    table = sinusoidal_positions(cfg.max_positions, cfg.d_model)
    for side in ("src", "tgt"):
        noise = 0.1 * torch.randn(table.shape, generator=gen)
        weights[f"{side}_embed.learned.weight"] = table + noise
    model.load_state_dict(weights)
    learned = save_checkpoint(Checkpoint(cfg, ckpt.vocab, model_state(model)), tmp_path / "l.pt")
    code, err = export("--to", "huggingface", str(learned), str(tmp_path / "hf"))
    assert code == 1 and "learned positions" in sole_error(err)
    assert not (tmp_path / "hf").exists()
    assert export("--to", "ctranslate2", str(learned), str(tmp_path / "ct2"))[0] == 0
    lines = LINES[:10]
    assert_same(nmt_greedy(load_checkpoint(learned), lines), ct2_greedy(tmp_path / "ct2", lines))


def test_pre_norm_goes_to_ctranslate2_but_not_to_marian(pre_norm: Path, tmp_path: Path) -> None:
    """CTranslate2's pre-norm layers and final norms decode the pre-norm copy model as
    nmt does; MarianMT's layers are post-norm only, so that export is refused."""
    code, err = export("--to", "huggingface", str(pre_norm), str(tmp_path / "hf"))
    assert code == 1 and "pre-norm layers (model.pre_norm)" in sole_error(err)
    assert not (tmp_path / "hf").exists()
    assert export("--to", "ctranslate2", str(pre_norm), str(tmp_path / "ct2"))[0] == 0
    ckpt = load_checkpoint(pre_norm)
    assert ckpt.model_config.pre_norm
    ours = nmt_greedy(ckpt, LINES)
    assert_same(ours, ct2_greedy(tmp_path / "ct2", LINES), cut=True)
    assert [ckpt.vocab.tgt.decode(t) for t, _ in ours[: len(COPY_POOL)]] == COPY_POOL


def test_restricted_attention_is_refused_by_both_targets(trained: Path, tmp_path: Path) -> None:
    """Neither target has a window: the export would attend everywhere and translate
    otherwise, so it is refused before anything is written."""
    ckpt = load_checkpoint(trained)
    cfg = dataclasses.replace(ckpt.model_config, attention_window=3)
    windowed = save_checkpoint(dataclasses.replace(ckpt, model_config=cfg), tmp_path / "w.pt")
    for target in ("ctranslate2", "huggingface"):
        code, err = export("--to", target, str(windowed), str(tmp_path / target))
        assert code == 1 and "model.attention_window 3" in sole_error(err)
        assert not (tmp_path / target).exists()


def test_bad_inputs_are_one_line_errors(trained: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, err = export("--to", "ctranslate2", str(trained), str(a_file))
    assert code == 1 and "exists and is not a directory" in sole_error(err)
    # the output is checked before the checkpoint is even read
    code, err = export("--to", "ctranslate2", str(tmp_path / "missing.pt"), str(a_file))
    assert code == 1 and "not a directory" in sole_error(err)
    code, err = export("--to", "ctranslate2", str(tmp_path / "missing.pt"), str(tmp_path / "o"))
    assert code == 1 and "no such checkpoint file" in sole_error(err)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    code, err = export("--to", "huggingface", str(trained), str(full))
    assert code == 1 and "--force" in sole_error(err) and (full / "keep.txt").is_file()
    code, err = export("--to", "onnx", str(trained), str(tmp_path / "o"))
    assert code == 2 and "'onnx'" in sole_error(err)
    code, err = export(
        "--to", "ctranslate2", "--quantization", "int3", str(trained), str(tmp_path / "q")
    )
    assert code == 2 and "--quantization 'int3'" in sole_error(err)
    assert not (tmp_path / "q").exists()


def test_force_replaces_a_directory_whole(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    code, err = export("--to", "ctranslate2", "--force", str(trained), str(out))
    assert code == 0, err
    assert not (out / "old.txt").exists() and (out / "model.bin").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging directory left


def test_missing_library_says_what_to_install(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # makes `import ctranslate2` fail
    code, err = export("--to", "ctranslate2", str(trained), str(tmp_path / "o"))
    assert code == 1 and "pip install 'nmt-cli[export]'" in sole_error(err)
    assert not (tmp_path / "o").exists()


def test_greedy_logprob_matches_teacher_forcing(trained: Path) -> None:
    """The reference side of the comparisons above: nmt's greedy log-probability is the
    model's teacher-forced log-probability of its output, EOS included."""
    ckpt = load_checkpoint(trained)
    model = ckpt.build_model()
    [(tokens, lp)] = nmt_greedy(ckpt, LINES[:1])
    src = torch.tensor([[*ckpt.vocab.src.encode(LINES[:1])[0], EOS_ID]])
    with torch.no_grad():
        logits = model(src, torch.tensor([[2, *tokens]])).float()
    expected = F.log_softmax(logits, -1)[0, torch.arange(len(tokens) + 1), [*tokens, EOS_ID]].sum()
    assert lp == pytest.approx(float(expected), abs=1e-5)
