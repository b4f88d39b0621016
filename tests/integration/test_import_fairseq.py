"""`nmt import --from fairseq`, checked without fairseq, which does not install cheaply
here. The checkpoint is written in fairseq's layout ({"args": Namespace, "model": state
dict}) under fairseq's documented state-dict names, in both namings fairseq has used
(q/k/v_proj and, before 0.7, one in_proj_weight with the encoder's layer_norms.0/1),
with dict.en.txt, dict.de.txt and subword-nmt bpecodes made here. Its weights come from
transformers' FSMT, the port of fairseq's WMT Transformer (fairseq's sinusoids offset by
padding_idx + 1, decoding from </s>), which gives the reference outputs: the same greedy
tokens and log-probabilities to 1e-4. Pre-norm checkpoints (`--encoder-normalize-before
--decoder-normalize-before`) come from transformers' MBart, the port of fairseq's
pre-norm Transformer (learned positions offset by padding_idx + 1, a final LayerNorm per
stack) with its embedding LayerNorm taken out, which fairseq's transformer adds only
under `layernorm_embedding`. bench/import_check_fairseq.py checks a checkpoint
trained by fairseq itself. The text side (Moses + BPE with fairseq's defaults) is
checked against sacremoses and subword-nmt directly."""

from __future__ import annotations

import argparse
import io
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner
from unix_helpers import no_escape

from nmt_cli.cli import app
from nmt_cli.core.batching import pad_sources
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.search import greedy_search
from nmt_cli.core.vocab import BOS_ID, EOS_ID
from nmt_cli.engines.importing.run import ImportConfig, import_model

transformers = pytest.importorskip("transformers")
sacremoses = pytest.importorskip("sacremoses")
apply_bpe = pytest.importorskip("subword_nmt.apply_bpe")
runner = CliRunner()

MAX_NEW = 20
SYLLABLES = ["ka", "to", "mi", "ra", "ne", "so", "lu", "pe", "di", "ga", "bo", "fu"]


def _lines(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(90)]
    punct = ["", ",", "'s", "-", "!"]
    return [
        " ".join(rng.choice(words) + rng.choice(punct) for _ in range(rng.randint(3, 10)))
        for _ in range(n)
    ]


def _moses(lang: str, lines: list[str]) -> list[str]:
    tok = sacremoses.MosesTokenizer(lang)
    return [
        tok.tokenize(x, aggressive_dash_splits=True, return_str=True, escape=True) for x in lines
    ]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bpecodes learned on both sides and one joined dictionary for both, as fairseq's
    WMT16 en-de model has them (FSMT ties its three embeddings, as share_all_embeddings
    does)."""
    from subword_nmt.learn_bpe import learn_bpe

    root = tmp_path_factory.mktemp("fairseq_data")
    sides = {"en": _moses("en", _lines(0, 300)), "de": _moses("de", _lines(1, 300))}
    codes = io.StringIO()
    learn_bpe([line + "\n" for lines in sides.values() for line in lines], codes, 150)
    (root / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = apply_bpe.BPE(io.StringIO(codes.getvalue()), separator="@@")
    lines = [line for side in sides.values() for line in side]
    counts = Counter(t for line in lines for t in bpe.process_line(line).split())
    text = "".join(f"{t} {c}\n" for t, c in counts.most_common())
    for lang in sides:
        (root / f"dict.{lang}.txt").write_text(text, encoding="utf-8")
    return root


def _dictionary(path: Path) -> dict[str, int]:
    words = ["<s>", "<pad>", "</s>", "<unk>"]
    words += [line.split(" ")[0] for line in path.read_text(encoding="utf-8").splitlines()]
    return {w: i for i, w in enumerate(words)}


# The tiny model both transformers stand-ins are built as, in fairseq's special ids.
SHAPE: dict[str, Any] = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    max_position_embeddings=64,
    scale_embedding=True,
    tie_word_embeddings=True,
    init_std=0.4,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=2,
)


def _mbart(vocab: int, activation: str) -> Any:
    """A pre-norm MBart with random weights (its LayerNorms' too, so that each must land
    in its place) and no LayerNorm on the embeddings."""
    config = transformers.MBartConfig(
        vocab_size=vocab,
        activation_function=activation,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = transformers.MBartForConditionalGeneration(config).eval()
    model.model.encoder.layernorm_embedding = torch.nn.Identity()
    model.model.decoder.layernorm_embedding = torch.nn.Identity()
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    drop = ("shared.", "lm_head.", "final_logits_bias")
    state = {
        k.removeprefix("model."): v.clone()
        for k, v in model.state_dict().items()
        if not k.removeprefix("model.").startswith(drop)
    }
    state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    return model, state


def write_fairseq(
    out: Path,
    data: Path,
    activation: str = "relu",
    legacy: bool = False,
    pre_norm: bool = False,
    **args: Any,
) -> Any:
    """An FSMT model (or, `pre_norm`, an MBart) with random weights, saved as fairseq
    saves a checkpoint."""
    src, tgt = _dictionary(data / "dict.en.txt"), _dictionary(data / "dict.de.txt")
    if pre_norm:
        model, state = _mbart(len(src), activation)
        return _save(out, model, state, legacy, activation, pre_norm, args)
    config = transformers.FSMTConfig(
        langs=["en", "de"],
        src_vocab_size=len(src),
        tgt_vocab_size=len(tgt),
        activation_function=activation,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = transformers.FSMTForConditionalGeneration(config).eval()
    state = {
        k.removeprefix("model."): v.clone()
        for k, v in model.state_dict().items()
        if "embed_positions" not in k
    }
    state["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    state["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    return _save(out, model, state, legacy, activation, pre_norm, args)


def _save(
    out: Path,
    model: Any,
    state: dict[str, torch.Tensor],
    legacy: bool,
    activation: str,
    pre_norm: bool,
    args: dict[str, Any],
) -> Any:
    if legacy:  # fairseq before 0.7: fused input projections, the encoder's layer_norms.N
        for name in [k for k in state if k.endswith("q_proj.weight")]:
            base = name.removesuffix(".q_proj.weight")
            for kind in ("weight", "bias"):
                parts = [state.pop(f"{base}.{p}_proj.{kind}") for p in "qkv"]
                state[f"{base}.in_proj_{kind}"] = torch.cat(parts)
        for name in [k for k in state if k.startswith("encoder.layers.") and "layer_norm." in k]:
            number = "0" if "self_attn_layer_norm" in name else "1"
            kind = name.rsplit(".", 1)[1]
            layer = name.split(".")[2]
            state[f"encoder.layers.{layer}.layer_norms.{number}.{kind}"] = state.pop(name)
        state.pop("decoder.output_projection.weight")
    settings = dict(
        arch="transformer",
        encoder_embed_dim=32,
        decoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        decoder_ffn_embed_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        activation_fn=activation,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        share_decoder_input_output_embed=True,
        share_all_embeddings=True,
        encoder_normalize_before=pre_norm,
        decoder_normalize_before=pre_norm,
        encoder_learned_pos=pre_norm,
        decoder_learned_pos=pre_norm,
        max_source_positions=60,
        max_target_positions=60,
        source_lang="en",
        target_lang="de",
    )
    settings.update(args)
    torch.save({"args": argparse.Namespace(**settings), "model": state}, out)
    return model


@pytest.mark.parametrize(
    ("activation", "legacy", "pre_norm"),
    [("relu", False, False), ("gelu", True, False), ("gelu", True, True)],
)
def test_the_import_decodes_as_fairseqs_transformer(
    tmp_path: Path, data_dir: Path, activation: str, legacy: bool, pre_norm: bool
) -> None:
    fsmt = write_fairseq(tmp_path / "checkpoint.pt", data_dir, activation, legacy, pre_norm)
    config = ImportConfig("fairseq", tmp_path / "checkpoint.pt", tmp_path / "m.pt")
    result = import_model(ImportConfig(**{**config.__dict__, "data_dir": data_dir}))
    assert result.model_config.positions == "learned" and result.model_config.output_bias
    assert result.model_config.pre_norm == pre_norm
    ckpt = load_checkpoint(tmp_path / "m.pt")
    assert ckpt.vocab.src.kind == ckpt.vocab.tgt.kind == "moses-bpe"
    assert ckpt.origin is not None and ckpt.origin["imported_from"] == "fairseq"
    model = ckpt.build_model()
    src_dict, tgt_dict = (
        _dictionary(data_dir / "dict.en.txt"),
        _dictionary(data_dir / "dict.de.txt"),
    )
    tgt_words = {i: w for w, i in tgt_dict.items()}

    sentences = _lines(5, 40)
    ids = ckpt.vocab.src.encode(sentences)
    theirs_src = [[src_dict.get(p, 3) for p in ckpt.vocab.src.pieces(row)] + [2] for row in ids]
    width = max(map(len, theirs_src))
    input_ids = torch.tensor([row + [1] * (width - len(row)) for row in theirs_src])
    mask = (input_ids != 1).long()
    with torch.no_grad():
        generated = fsmt.generate(
            input_ids=input_ids,
            attention_mask=mask,
            num_beams=1,
            do_sample=False,
            max_new_tokens=MAX_NEW + 1,
            bad_words_ids=[[1]],
        )
        # use_cache=False: FSMT builds its causal mask only then
        logits = fsmt(
            input_ids=input_ids, attention_mask=mask, decoder_input_ids=generated, use_cache=False
        ).logits
    theirs_lp = torch.log_softmax(logits.float(), -1)

    src = pad_sources(ids)
    hyps = greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_NEW)
    distinct = 0
    for row, hyp in enumerate(hyps):
        tokens = hyp[0].tokens
        theirs = [tgt_words[int(i)] for i in generated[row, 1:] if int(i) != 1]
        ours = [*ckpt.vocab.tgt.pieces(tokens), "</s>"]
        assert ours == theirs, f"sentence {row}"
        distinct += len(set(tokens)) > 2
        tgt_in = torch.tensor([[BOS_ID, *tokens]])
        with torch.no_grad():
            mine = torch.log_softmax(model(src[row : row + 1], tgt_in).float(), -1)[0]
        wanted = torch.tensor([*tokens, EOS_ID])
        picked_mine = mine.gather(-1, wanted[:, None]).squeeze(-1)
        theirs_ids = generated[row, 1 : len(tokens) + 2]
        picked_theirs = theirs_lp[row, : len(tokens) + 1].gather(-1, theirs_ids[:, None])
        torch.testing.assert_close(picked_mine, picked_theirs.squeeze(-1), atol=1e-4, rtol=0)
    assert distinct >= 1  # not one token repeated: the positions and the context matter


def test_text_goes_through_moses_and_bpe_as_fairseq_reads_it(
    tmp_path: Path, data_dir: Path
) -> None:
    write_fairseq(tmp_path / "checkpoint.pt", data_dir)
    args = ["import", "--from", "fairseq", str(tmp_path / "checkpoint.pt")]
    out = runner.invoke(app, [*args, "--data-dir", str(data_dir), "-o", str(tmp_path / "m.pt")])
    no_escape(out)
    assert out.exit_code == 0, out.output
    ckpt = load_checkpoint(tmp_path / "m.pt")
    text = "kato's mira-sone, lupe!"
    tokens = _moses("en", [text])[0]
    bpe = apply_bpe.BPE(io.StringIO((data_dir / "bpecodes").read_text()), separator="@@")
    pieces = bpe.process_line(tokens).split()
    known = _dictionary(data_dir / "dict.en.txt")
    (ids,) = ckpt.vocab.src.encode([text])
    assert ckpt.vocab.src.pieces(ids) == [p if p in known else "<unk>" for p in pieces]
    assert "<unk>" in ckpt.vocab.src.pieces(ids)  # "@-@" never occurs in the training text
    assert "@-@" in tokens and "&apos;s" in tokens  # fairseq's defaults: dash splits, escaping
    # decoding: "@@ " removed, then Moses detokenization in the target's language
    (de_ids,) = ckpt.vocab.tgt.encode(["sone, lupe's kato!"])
    detok = sacremoses.MosesDetokenizer("de")
    assert ckpt.vocab.tgt.decode(de_ids) == detok.detokenize(
        _moses("de", ["sone, lupe's kato!"])[0].split()
    )
    (tmp_path / "in.txt").write_text("kato mira sone\n")
    result = runner.invoke(
        app, ["translate", "-m", str(tmp_path / "m.pt"), "-i", str(tmp_path / "in.txt"), "-q"]
    )
    no_escape(result)
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1
    exported = runner.invoke(
        app, ["export", str(tmp_path / "m.pt"), str(tmp_path / "hf"), "--to", "huggingface"]
    )
    no_escape(exported)
    assert exported.exit_code == 1 and "Moses" in exported.output


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"encoder_normalize_before": True},
            "encoder_normalize_before = True but decoder_normalize_before = False",
        ),
        (
            {"encoder_normalize_before": True, "decoder_normalize_before": True}
            | {"no_decoder_final_norm": True},
            "no_decoder_final_norm = True",
        ),
        ({"layernorm_embedding": True}, "layernorm_embedding = True: a LayerNorm on the embed"),
        ({"arch": "lstm"}, "arch 'lstm'"),
        ({"activation_fn": "tanh"}, "activation_fn 'tanh'"),
        ({"decoder_ffn_embed_dim": 128}, "encoder_ffn_embed_dim 64 but decoder_ffn_embed_dim 128"),
        ({"no_scale_embedding": True}, "unscaled embeddings"),
    ],
)
def test_what_nmt_cannot_compute_is_refused_by_name(
    tmp_path: Path, data_dir: Path, change: dict[str, Any], message: str
) -> None:
    write_fairseq(tmp_path / "checkpoint.pt", data_dir, **change)
    args = ["import", "--from", "fairseq", str(tmp_path / "checkpoint.pt")]
    result = runner.invoke(app, [*args, "--data-dir", str(data_dir), "-o", str(tmp_path / "m.pt")])
    no_escape(result)
    assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "m.pt").exists()


def test_fairseq_012_command_line_checkpoints_keep_their_settings_in_cfg(
    tmp_path: Path, data_dir: Path
) -> None:
    """fairseq 0.12 trained from the command line (`--arch transformer`) stores no `args`:
    its settings are `cfg["model"]`, an argparse Namespace, and `cfg["task"]` names no
    languages when the data directory did. Imported, the weights equal those of the
    older layout; the languages must then be given."""
    write_fairseq(tmp_path / "old.pt", data_dir)
    with torch.serialization.safe_globals([argparse.Namespace]):  # fairseq's settings
        raw = torch.load(tmp_path / "old.pt", weights_only=True)
    settings = vars(raw.pop("args"))
    settings.pop("source_lang"), settings.pop("target_lang")
    task = {"_name": "translation", "source_lang": None, "target_lang": None}
    raw.update(args=None, cfg={"model": argparse.Namespace(**settings), "task": task})
    torch.save(raw, tmp_path / "new.pt")
    base = ["import", "--from", "fairseq", "--data-dir", str(data_dir)]
    unnamed = runner.invoke(app, [*base, str(tmp_path / "new.pt"), "-o", str(tmp_path / "x.pt")])
    no_escape(unnamed)
    assert unnamed.exit_code == 1 and "--src and --tgt" in unnamed.output
    for name in ("old", "new"):
        languages = ["--src", "en", "--tgt", "de"] if name == "new" else []
        out = [str(tmp_path / f"{name}.pt"), "-o", str(tmp_path / f"{name}.nmt.pt"), *languages]
        done = runner.invoke(app, [*base, *out])
        assert done.exit_code == 0, done.output
    old, new = (load_checkpoint(tmp_path / f"{n}.nmt.pt") for n in ("old", "new"))
    assert old.model_config == new.model_config
    assert old.model.keys() == new.model.keys()
    for key, value in old.model.items():
        assert torch.equal(value, new.model[key]), key
