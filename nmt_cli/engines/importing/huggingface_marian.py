"""Import a transformers MarianMT directory (OPUS-MT, Tatoeba, or `nmt export`'s own).

The exact inverse of `nmt export --to huggingface` (engines/export/huggingface.py), and
of what transformers' MarianMT computes for any directory it accepts, with every
difference mapped or refused by name:

- Layers. MarianMT is post-norm (LayerNorm after each residual add, eps 1e-5, no final
  norm), as nmt is. Its config.json may carry BART-era keys (`normalize_before`,
  `normalize_embedding`, `add_final_layer_norm`, `static_position_embeddings`) that its
  code ignores; a value claiming another model than the one it computes is refused,
  since the weights' meaning is then in doubt. Encoder and decoder must have the same
  heads and feed-forward size, the embeddings must be scaled by sqrt(d_model), and the
  output projection must be the decoder embedding (`tie_word_embeddings`).
- Activation. relu, swish / silu and gelu (exact) become `model.activation`.
- Positions. Marian's sinusoids are ours with the d_model coordinates permuted (sin half,
  cos half); every d_model axis of every weight is permuted back.
- Vocabulary. The SentencePiece models are renumbered to the ids of vocab.json (or
  target_vocab.json) with nmt's specials first, and the embedding rows gathered to
  match (marian_vocab.py). Marian starts decoding from <pad>; the imported <s> is
  <pad>'s row with an output bias BOS_BIAS_GAP lower (common.py), so nmt's
  distributions equal Marian's. One SentencePiece model and one table for both sides
  give one nmt vocabulary and one embedding matrix (section 3.4's three-way tie);
  otherwise the source gets its own.
- `final_logits_bias` becomes `model.output_bias` when it is not zero.
- Multilingual models whose table holds target-language tokens (>>fra<<) are refused:
  nmt has no place for the token MarianTokenizer cuts off the front of a sentence.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.core.layer_map import DECODER, ENCODER, KINDS, OUTPUT_BIAS, join
from nmt_cli.core.model_config import Activation, ModelConfig
from nmt_cli.core.vocab import BOS_ID, PAD_ID, VocabPair
from nmt_cli.engines.export.huggingface import marian_layer_names, marian_permutation
from nmt_cli.engines.importing.common import (
    BOS_BIAS_GAP,
    Imported,
    build_checkpoint,
    read_json,
    unpermute,
)
from nmt_cli.engines.importing.marian_vocab import (
    WHERE,
    MarianIds,
    read_spm,
    read_table,
    refuse,
    source_side,
    special_ids,
    target_side,
)
from nmt_cli.engines.importing.spm_proto import UNKNOWN
from nmt_cli.optional import require

ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "swish": "silu", "silu": "silu"}
ACTIVATIONS["gelu"] = "gelu"  # transformers' "gelu" is the exact (erf) form
# config.json keys MarianMT's code ignores, and the value that agrees with what it computes.
IGNORED_KEYS = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "static_position_embeddings": True,
}
_LANGUAGE_TOKEN = re.compile(r"^>>.+<<$")


def import_marian(model_dir: Path, languages: tuple[str, str] = ("", "")) -> Imported:
    """The MarianMT model in `model_dir` as an nmt checkpoint (see the module docstring)."""
    if not model_dir.is_dir():
        raise refuse(f"{model_dir}: not a directory (a transformers model directory)")
    config = read_json(model_dir / "config.json", "the model's configuration")
    tokenizer = _optional_json(model_dir / "tokenizer_config.json")
    generation = _optional_json(model_dir / "generation_config.json")
    _check_architecture(config)
    notes: list[str] = []
    weights = _read_weights(model_dir)
    encoder_vocab = read_table(model_dir / "vocab.json")
    separate = bool(tokenizer.get("separate_vocabs", False))
    decoder_vocab = read_table(model_dir / "target_vocab.json") if separate else encoder_vocab
    for table in (encoder_vocab, decoder_vocab):
        codes = [piece for piece in table if _LANGUAGE_TOKEN.match(piece)]
        if codes:
            raise refuse(
                f"a multilingual model (target-language tokens such as {codes[0]}): nmt "
                "cannot put the token before each sentence as MarianTokenizer does"
            )
    ids = special_ids(config, tokenizer, generation, encoder_vocab, decoder_vocab)
    source_spm = read_spm(model_dir / "source.spm")
    target_spm = read_spm(model_dir / "target.spm")
    target = target_side(target_spm, decoder_vocab, ids, notes)
    source = source_side(source_spm, encoder_vocab, ids, notes)
    embeddings = _embeddings(config, weights)
    joint = (
        source_spm == target_spm
        and encoder_vocab == decoder_vocab
        and torch.equal(embeddings[0], embeddings[1])
        and set(encoder_vocab) >= {p.text for p in source_spm.pieces if p.kind != UNKNOWN}
    )
    if joint:
        source = target  # one vocabulary: the three-way tie of section 3.4
    bias = _output_bias(weights, target.rows, ids, notes)
    cfg = ModelConfig(
        encoder_layers=int(config["encoder_layers"]),
        decoder_layers=int(config["decoder_layers"]),
        d_model=int(config["d_model"]),
        d_ff=int(config["encoder_ffn_dim"]),
        n_heads=int(config["encoder_attention_heads"]),
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        relu_dropout=float(config.get("activation_dropout", 0.0)),
        positions="sinusoidal",
        max_positions=int(config.get("max_position_embeddings", 1024)),
        src_vocab_size=len(source.rows),
        tgt_vocab_size=len(target.rows),
        pad_id=PAD_ID,
        share_embeddings=True,
        joint_vocab=joint,
        activation=ACTIVATIONS[str(config.get("activation_function", "gelu"))],
        output_bias=bias is not None,
    )
    state = _layers(weights, cfg)
    perm = marian_permutation(cfg.d_model)
    _, cols = unpermute(perm)
    state[ENCODER.tokens] = cols(embeddings[0][source.rows])
    state[DECODER.tokens] = cols(embeddings[1][target.rows])
    if bias is not None:
        state[OUTPUT_BIAS] = bias
    vocab = VocabPair.from_protos(source.proto, target.proto)
    origin = {
        "imported_from": "huggingface-marian",
        "directory": model_dir.name,
        "name_or_path": str(config.get("_name_or_path", "")),
        "transformers_version": str(config.get("transformers_version", "")),
        "notes": list(notes),
    }
    checkpoint = build_checkpoint(cfg, vocab, state, _languages(languages, tokenizer), origin)
    return Imported(checkpoint, tuple(notes))


def _optional_json(path: Path) -> dict[str, Any]:
    return read_json(path, "") if path.is_file() else {}


def _languages(given: tuple[str, str], tokenizer: dict[str, Any]) -> tuple[str, str]:
    src = given[0] or str(tokenizer.get("source_lang") or "")
    tgt = given[1] or str(tokenizer.get("target_lang") or "")
    return src, tgt


def _check_architecture(config: dict[str, Any]) -> None:
    """Refuse, by name, every setting that makes MarianMT compute another model than
    nmt's Transformer."""
    kind = config.get("model_type")
    if kind != "marian":
        raise refuse(f"config.json has model_type {kind!r}; only MarianMT ('marian') imports")
    required = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads")
    missing = [key for key in (*required, "encoder_ffn_dim") if key not in config]
    if missing:
        raise refuse(f"config.json lacks {', '.join(missing)}")
    for ours, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(theirs, config[ours]) != config[ours]:
            raise refuse(
                f"{ours} = {config[ours]} but {theirs} = {config[theirs]}: nmt's encoder "
                "and decoder layers have one size"
            )
    if int(config["d_model"]) % int(config["encoder_attention_heads"]):
        raise refuse("d_model is not a multiple of the attention heads")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        known = ", ".join(sorted(ACTIVATIONS))
        raise refuse(f"activation_function {activation!r}: nmt implements {known}")
    if not config.get("scale_embedding", False):
        raise refuse(
            "scale_embedding is false: nmt scales embeddings by sqrt(d_model) (section "
            "3.4), and its output projection is the same matrix, so unscaled embeddings "
            "cannot be mapped"
        )
    if not config.get("tie_word_embeddings", True):
        raise refuse(
            "tie_word_embeddings is false: nmt's output projection is the decoder's "
            "embedding matrix (section 3.4)"
        )
    for key, computed in IGNORED_KEYS.items():
        if key in config and bool(config[key]) != computed:
            raise refuse(
                f"config.json sets {key} = {config[key]!r}, which transformers' MarianMT "
                f"ignores (it computes {key} = {computed}): which model the weights "
                "belong to is unclear"
            )


def _read_weights(model_dir: Path) -> dict[str, Tensor]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file() or index.is_file():
        st = require("safetensors.torch", purpose=f"nmt import {WHERE}")
        files = (
            [single]
            if single.is_file()
            else sorted({model_dir / f for f in read_json(index, "")["weight_map"].values()})
        )
        weights: dict[str, Tensor] = {}
        for path in files:
            weights.update(st.load_file(str(path)))
        return weights
    legacy = model_dir / "pytorch_model.bin"
    if legacy.is_file():
        try:
            loaded = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise refuse(f"{legacy}: not loadable as weights only ({exc})") from None
        return dict(loaded)
    raise refuse(f"{model_dir}: no model.safetensors or pytorch_model.bin")


def _embeddings(config: dict[str, Any], weights: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(encoder, decoder) embedding matrices; the decoder's is also the output projection."""
    shared = weights.get("model.shared.weight")
    encoder = weights.get("model.encoder.embed_tokens.weight", shared)
    share = bool(config.get("share_encoder_decoder_embeddings", True))
    decoder = weights.get("model.decoder.embed_tokens.weight", shared if share else None)
    if encoder is None or decoder is None:
        raise refuse("the weights lack the embedding matrices")
    head = weights.get("lm_head.weight")
    if head is not None and not torch.equal(head, decoder):
        raise refuse("lm_head differs from the decoder embedding: nmt ties them (section 3.4)")
    return encoder.float(), decoder.float()


def _output_bias(
    weights: dict[str, Tensor], rows: list[int], ids: MarianIds, notes: list[str]
) -> Tensor | None:
    """`final_logits_bias` in nmt's target ids; None where the model needs none."""
    marian = weights.get("final_logits_bias")
    marian = torch.zeros(len(ids.text)) if marian is None else marian.float().reshape(-1)
    if marian.numel() != len(ids.text):
        raise refuse(f"final_logits_bias has {marian.numel()} entries, not {len(ids.text)}")
    nonzero = bool(marian.any())
    if not nonzero and ids.start != ids.pad:
        return None
    bias = marian[rows].clone()
    if ids.start == ids.pad:
        bias[BOS_ID] = marian[ids.pad] - BOS_BIAS_GAP
    if nonzero:
        notes.append("final_logits_bias becomes the output projection's bias")
    return bias


def _layers(weights: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Every layer's weights under nmt's names, the d_model axes permuted back: the
    export's mapping (marian_layer_names) read the other way."""
    rows, cols = unpermute(marian_permutation(cfg.d_model))
    out: dict[str, Tensor] = {}

    def get(name: str) -> Tensor:
        try:
            return weights[name]
        except KeyError:
            raise refuse(f"the weights lack {name}") from None

    for role, theirs in marian_layer_names(cfg):
        for kind in KINDS:
            axis = role.axis(kind)
            parts = [get(f"{name}.{kind}").float() for name in theirs]
            parts = [rows(t) if axis == "rows" else cols(t) if axis == "cols" else t for t in parts]
            out[f"{role.name}.{kind}"] = join(parts).contiguous()
    return out
