"""`nmt import --from huggingface` against transformers itself: MarianMT models built by
transformers (tiny configurations, random weights, SentencePiece models trained here),
saved with `save_pretrained` in OPUS-MT's layout (one vocab.json numbering both
SentencePiece models' pieces, </s> 0, <unk> 1, <pad> last and the decoder start, a
non-zero `final_logits_bias`), imported, and compared: the same greedy tokens as
`generate` on 50 sentences and the same log-probabilities to 1e-4 in float32, for ReLU,
SiLU (swish) and GELU. transformers' MarianMT has no pre-norm form (its config's
`normalize_before` is ignored), so a directory claiming one is refused by name. Then
`nmt export --to huggingface` followed by `nmt import` returns the same weights and
vocabularies byte for byte."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner
from unix_helpers import no_escape

from nmt_cli.cli import app
from nmt_cli.core.batching import pad_sources
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint
from nmt_cli.core.search import greedy_search
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID
from nmt_cli.engines.export.run import ExportConfig, export_model
from nmt_cli.engines.importing.run import ImportConfig, import_model
from tests.fixtures.translation_ckpt import separate_vocab, tiny_config, tiny_vocab

transformers = pytest.importorskip("transformers")
runner = CliRunner()

SYLLABLES = ["ka", "to", "mi", "ra", "ne", "so", "lu", "pe", "di", "ga", "bo", "fu", "ze", "ri"]
MAX_NEW = 24  # tokens before the end is forced, on both sides


def _words(rng: random.Random) -> list[str]:
    return ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(150)]


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], list[str]]:
    rng = random.Random(0)
    words = _words(rng)
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    tgt = [" ".join(rng.choice(words)[::-1] for _ in range(rng.randint(3, 12))) for _ in src]
    return src, tgt


@pytest.fixture(scope="module")
def spm_models(corpus: tuple[list[str], list[str]]) -> tuple[bytes, bytes]:
    """Two SentencePiece models with SentencePiece's own ids (<unk> 0, <s> 1, </s> 2), as
    OPUS-MT's are: trained once for the module."""
    import io

    import sentencepiece as spm

    protos = []
    for lines, size in zip(corpus, (120, 100), strict=True):
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.Train(
            sentence_iterator=iter(lines),
            model_writer=buffer,
            vocab_size=size,
            model_type="unigram",
            minloglevel=2,
            num_threads=1,
        )
        protos.append(buffer.getvalue())
    return protos[0], protos[1]


def _pieces(proto: bytes) -> list[str]:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    return [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]


def _table(protos: list[bytes]) -> dict[str, int]:
    """OPUS-MT's vocab.json: </s> 0, <unk> 1, every piece of the models once, <pad> last."""
    table = {"</s>": 0, "<unk>": 1}
    for proto in protos:
        for piece in _pieces(proto):
            if piece not in table and piece != "<s>":
                table[piece] = len(table)
    table["<pad>"] = len(table)
    return table


def write_marian(
    out: Path, spm_models: tuple[bytes, bytes], activation: str, separate: bool, seed: int = 0
) -> tuple[Any, Any]:
    """A random MarianMTModel and its MarianTokenizer, saved in `out` by transformers."""
    out.mkdir(parents=True)
    (out / "source.spm").write_bytes(spm_models[0])
    (out / "target.spm").write_bytes(spm_models[1])
    files: dict[str, Any] = {}
    if separate:
        source, target = _table([spm_models[0]]), _table([spm_models[1]])
        (out / "vocab.json").write_text(json.dumps(source))
        (out / "target_vocab.json").write_text(json.dumps(target))
        files = {"target_vocab_file": str(out / "target_vocab.json"), "separate_vocabs": True}
    else:
        source = target = _table(list(spm_models))
        (out / "vocab.json").write_text(json.dumps(source))
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        **files,
    )
    pad = target["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=not separate,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function=activation,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        max_position_embeddings=64,
        init_std=0.4,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # OPUS-MT's bias is Marian's trained output bias, not zero
        model.final_logits_bias.normal_(0.0, 0.3)
        model.final_logits_bias[0, 0] += 2.0  # and some sentences end early
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=pad,
        eos_token_id=0,
        pad_token_id=pad,
        forced_eos_token_id=0,
        bad_words_ids=[[pad]],
        num_beams=1,
        max_length=64,
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model, tokenizer


def _nmt_log_probs(model: Transformer, src: torch.Tensor, outputs: list[list[int]]) -> list:
    """Each output token's log-probability under `model`, teacher-forced."""
    width = max(len(o) for o in outputs) + 1
    tgt_in = torch.zeros(len(outputs), width, dtype=torch.long)
    tgt_out = torch.zeros_like(tgt_in)
    for row, ids in enumerate(outputs):
        tgt_in[row, : len(ids) + 1] = torch.tensor([BOS_ID, *ids])
        tgt_out[row, : len(ids) + 1] = torch.tensor([*ids, EOS_ID])
    with torch.no_grad():
        lp = torch.log_softmax(model(src, tgt_in).float(), -1)
    picked = lp.gather(-1, tgt_out[..., None]).squeeze(-1)
    return [picked[row, : len(ids) + 1] for row, ids in enumerate(outputs)]


@pytest.mark.parametrize(
    ("activation", "separate"),
    [("relu", False), ("swish", False), ("gelu", False), ("silu", True)],
)
def test_the_import_decodes_as_transformers_does(
    tmp_path: Path,
    corpus: tuple[list[str], list[str]],
    spm_models: tuple[bytes, bytes],
    activation: str,
    separate: bool,
) -> None:
    marian, tokenizer = write_marian(tmp_path / "marian", spm_models, activation, separate)
    result = import_model(ImportConfig("huggingface", tmp_path / "marian", tmp_path / "m.pt"))
    assert result.model_config.activation == {"swish": "silu"}.get(activation, activation)
    assert result.model_config.output_bias and not result.joint_vocab
    ckpt = load_checkpoint(tmp_path / "m.pt")
    assert ckpt.origin is not None and ckpt.origin["imported_from"] == "huggingface-marian"
    model = ckpt.build_model()

    sentences = corpus[0][:50]
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = marian.generate(
            **batch, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW + 1
        )
        logits = marian(**batch, decoder_input_ids=generated[:, :-1]).logits
    theirs_lp = torch.log_softmax(logits.float(), -1).gather(-1, generated[:, 1:, None])
    decoder_table = tokenizer.decoder
    pad = marian.config.pad_token_id

    ids = ckpt.vocab.src.encode(sentences)
    # the same pieces go in: nmt's source ids are MarianTokenizer's, renumbered
    source_table = {i: piece for piece, i in tokenizer.encoder.items()}
    assert [ckpt.vocab.src.pieces(row) for row in ids] == [
        [source_table[int(i)] for i in row[mask.bool()][:-1]]
        for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    src = pad_sources(ids)
    hyps = greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_NEW)
    ours = [h[0].tokens for h in hyps]
    mine_lp = _nmt_log_probs(model, src, ours)
    ended = 0
    for row, tokens in enumerate(ours):
        theirs = [decoder_table[int(i)] for i in generated[row, 1:] if int(i) != pad]
        assert [*ckpt.vocab.tgt.pieces(tokens), "</s>"] == theirs, f"sentence {row}"
        n = len(tokens) + 1
        their_lp = theirs_lp[row, :n, 0]
        torch.testing.assert_close(mine_lp[row], their_lp, atol=1e-4, rtol=0)
        assert hyps[row][0].log_prob == pytest.approx(float(their_lp.sum()), abs=1e-4 * n)
        ended += n <= MAX_NEW
    assert ended >= 1  # some sentences end by themselves, not only at the limit


def test_nmt_translate_gives_transformers_text(
    tmp_path: Path,
    corpus: tuple[list[str], list[str]],
    spm_models: tuple[bytes, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the CLI: import, then `nmt translate` (greedy) prints what
    MarianTokenizer decodes from `generate`."""
    monkeypatch.chdir(tmp_path)
    marian, tokenizer = write_marian(tmp_path / "marian", spm_models, "swish", False, seed=1)
    out = runner.invoke(
        app, ["import", "--from", "huggingface", str(tmp_path / "marian"), "-o", "m.pt"]
    )
    no_escape(out)
    assert out.exit_code == 0, out.output
    assert "note: Marian starts decoding from '<pad>'" in out.output
    sentences = corpus[0][50:60]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    # transformers computes in float32; a CPU with bf16 units would pick bf16 by default
    greedy = ["--beam", "1", "--max-len-a", "0", "--max-len-b", str(MAX_NEW), "-q"]
    greedy += ["--precision", "fp32"]
    result = runner.invoke(app, ["translate", "-m", "m.pt", "-i", "in.txt", *greedy])
    assert result.exit_code == 0, result.output
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = marian.generate(
            **batch, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW + 1
        )
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert result.stdout.splitlines() == texts


@pytest.fixture(scope="module")
def saved_marian(tmp_path_factory: pytest.TempPathFactory, spm_models: tuple[bytes, bytes]) -> Path:
    root = tmp_path_factory.mktemp("marian")
    write_marian(root / "model", spm_models, "relu", False)
    return root / "model"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"normalize_before": True},
            "config.json sets normalize_before = True, which transformers' MarianMT ignores "
            "(it computes normalize_before = False): which model the weights belong to is "
            "unclear",
        ),
        (
            {"scale_embedding": False},
            "scale_embedding is false: nmt scales embeddings by sqrt(d_model) (section 3.4), "
            "and its output projection is the same matrix, so unscaled embeddings cannot be "
            "mapped",
        ),
        (
            {"activation_function": "gelu_new"},
            "activation_function 'gelu_new': nmt implements gelu, relu, silu, swish",
        ),
        (
            {"decoder_ffn_dim": 128},
            "encoder_ffn_dim = 64 but decoder_ffn_dim = 128: nmt's encoder and decoder layers "
            "have one size",
        ),
        (
            {"model_type": "bart"},
            "config.json has model_type 'bart'; only MarianMT ('marian') imports",
        ),
        (
            {"tie_word_embeddings": False},
            "tie_word_embeddings is false: nmt's output projection is the decoder's embedding "
            "matrix (section 3.4)",
        ),
    ],
)
def test_what_nmt_cannot_compute_is_refused_by_name(
    tmp_path: Path,
    saved_marian: Path,
    change: dict[str, Any],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 1 and, last on stderr, the line a user reads: the setting, its value and why."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    shutil.copytree(saved_marian, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    result = runner.invoke(app, ["import", "--from", "huggingface", str(model), "-o", "x.pt"])
    no_escape(result)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == f"error: --from huggingface: {message}"
    assert not (tmp_path / "x.pt").exists()


def test_a_multilingual_table_and_bad_paths_are_refused(
    tmp_path: Path, saved_marian: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    shutil.copytree(saved_marian, model)
    table = json.loads((model / "vocab.json").read_text())
    table[">>fra<<"] = len(table)
    (model / "vocab.json").write_text(json.dumps(table))
    # A model or a path that cannot serve: exit 1; a value the option never takes: exit 2.
    hf = ["import", "--from", "huggingface"]
    cases = [
        (
            [*hf, str(model), "-o", "x.pt"],
            1,
            "error: --from huggingface: a multilingual model (target-language tokens such as "
            ">>fra<<): nmt cannot put the token before each sentence as MarianTokenizer does",
        ),
        (
            [*hf, str(tmp_path / "no"), "-o", "x.pt"],
            1,
            f"error: --from huggingface: {tmp_path / 'no'}: not a directory (a transformers "
            "model directory)",
        ),
        (
            [*hf, str(saved_marian), "-o", str(tmp_path)],
            1,
            f"error: --output {tmp_path}: is a directory; name a file to write",
        ),
        (
            [*hf, str(saved_marian), "-o", "-"],
            2,
            "error: --output: name a checkpoint file to write (.pt), not stdout",
        ),
    ]
    for args, code, line in cases:
        result = runner.invoke(app, args)
        no_escape(result)
        assert result.exit_code == code, (args, result.output)
        assert result.stderr.splitlines()[-1] == line, (args, result.output)
        assert not (tmp_path / "x.pt").exists()


def _random_bias(ckpt: Checkpoint) -> Checkpoint:
    weights = dict(ckpt.model)
    weights["output_bias"] = torch.randn(ckpt.model_config.tgt_vocab_size)
    return Checkpoint(ckpt.model_config, ckpt.vocab, weights)


@pytest.mark.parametrize(
    ("vocabulary", "settings"),
    [("joint", {}), ("separate", {}), ("joint", {"activation": "silu", "output_bias": True})],
)
def test_export_then_import_returns_the_same_model(
    tmp_path: Path, vocabulary: str, settings: dict[str, Any]
) -> None:
    import dataclasses

    vocab = tiny_vocab() if vocabulary == "joint" else separate_vocab()
    cfg = dataclasses.replace(tiny_config(vocab), **settings)
    torch.manual_seed(0)
    original = Checkpoint(cfg, vocab, model_state(Transformer(cfg)))
    if cfg.output_bias:
        original = _random_bias(original)
    save_checkpoint(original, tmp_path / "a.pt")
    export_model(ExportConfig(tmp_path / "a.pt", tmp_path / "hf", "huggingface"))
    import_model(ImportConfig("huggingface", tmp_path / "hf", tmp_path / "b.pt"))
    back = load_checkpoint(tmp_path / "b.pt")
    assert back.model_config == original.model_config
    assert back.vocab.src.model_proto == vocab.src.model_proto
    assert back.vocab.tgt.model_proto == vocab.tgt.model_proto
    assert back.model.keys() == original.model.keys()
    for name, weight in original.model.items():
        assert torch.equal(back.model[name], weight), name
    bias_note = ["final_logits_bias becomes the output projection's bias"]
    assert back.origin is not None and back.origin["notes"] == (
        bias_note if cfg.output_bias else []
    )


def test_sentencepiece_renumbering_keeps_the_segmentation(spm_models: tuple[bytes, bytes]) -> None:
    """The rewritten model cuts text into the same pieces, with nmt's special ids."""
    import sentencepiece as spm

    from nmt_cli.engines.importing.spm_proto import (
        CONTROL,
        UNUSED,
        Piece,
        SentencePieceModel,
    )

    model = SentencePieceModel.parse(spm_models[0])
    rest = [p for p in model.pieces[3:]]
    pieces = [Piece("<pad>", 0, CONTROL), model.pieces[0], model.pieces[1], model.pieces[2]]
    pieces += [*reversed(rest), Piece("▁extra", 0.0, UNUSED)]
    proto = model.with_pieces(pieces)
    before, after = spm.SentencePieceProcessor(), spm.SentencePieceProcessor()
    before.LoadFromSerializedProto(spm_models[0])
    after.LoadFromSerializedProto(proto)
    assert (after.pad_id(), after.unk_id(), after.bos_id(), after.eos_id()) == (0, 1, 2, 3)
    text = ["kato mira sone", "lupe di gaboze extra"]
    assert after.Encode(text, out_type=str) == before.Encode(text, out_type=str)
    assert after.DecodeIds([after.PieceToId("▁extra")]) == "extra"
    assert model.with_pieces(pieces[:4] + rest) != spm_models[0]
    same = SentencePieceModel.parse(tiny_vocab().src.model_proto)  # nmt's own ids
    assert same.with_pieces(same.pieces) == same.original


def test_the_help_fits_80_columns() -> None:
    result = runner.invoke(app, ["import", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and "--from SOURCE" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
