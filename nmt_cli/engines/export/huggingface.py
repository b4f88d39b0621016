"""Export to a Hugging Face transformers MarianMT directory.

MarianMT is the paper's Transformer as transformers implements it: post-norm layers
(LayerNorm after each residual add, eps 1e-5, no final norm), sinusoidal positions,
token embeddings scaled by sqrt(d_model) (`scale_embedding`), a feed-forward with
`model.activation` (`activation_function` "relu", "silu" or "gelu"), and one embedding
matrix shared by the encoder, the decoder and the output projection
(`share_encoder_decoder_embeddings`, tied `lm_head`), with a `final_logits_bias` that is
`model.output_bias` or zero. `nmt import --from huggingface` is the inverse
(engines/importing/huggingface_marian.py). What needs care:

- Positions. Marian's sinusoid table puts sin in the first half of the dimensions and
  cos in the second; ours interleaves them (sin on even, cos on odd, the paper's
  formula), and Marian does not store the table: `from_pretrained` rebuilds it. So the
  model's d_model coordinates are permuted instead, exactly: with P = [0, 2, 4, ..., 1, 3,
  5, ...], Marian's table equals ours[:, P], and permuting every d_model-sized axis
  (embedding columns; inputs of Q, K, V, fc1; outputs and biases of the attention output
  projections and fc2; LayerNorm weights and biases) gives a model whose residual stream
  is ours permuted by P at every point. LayerNorm, ReLU and dot products do not care about
  the order of coordinates, and the logits h·E^T are unchanged. Learned positions have no
  place in Marian (it rebuilds the sinusoids) and are refused.
- Attention. Our fused projections are split into q_proj / k_proj / v_proj (rows [Q; K;
  V], h heads of d_k each, the head layout Marian uses), which needs d_k = d_v =
  d_model / h.
- Tokens. Our ids are the SentencePiece ids (pad 0, unk 1, <s> 2, </s> 3). Marian starts
  decoding from pad by convention; ours starts from <s>, so `decoder_start_token_id` is 2.
  eos 3, pad 0, and `forced_eos_token_id` 3 (the end is forced at the length limit, as
  our search does). The generation config suppresses <pad> and <s>, which our search
  never generates, and defaults to the paper's beam 4.
- Tokenizer. MarianTokenizer files: source.spm, target.spm, vocab.json (piece -> id, our
  ids) and, with separate vocabularies, target_vocab.json; it appends </s> to the source
  as our encoder input has it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.core.checkpoint import Checkpoint
from nmt_cli.core.layer_map import DECODER, ENCODER, KINDS, OUTPUT_BIAS, Role, roles, split
from nmt_cli.core.transformer import ModelConfig, sinusoidal_positions
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.engines.export.output import all_pieces, write_json, write_sentencepiece
from nmt_cli.engines.fairseq_names import fairseq_modules
from nmt_cli.errors import NmtError
from nmt_cli.optional import require

USAGE = """# MarianMT model exported by nmt

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("MODEL_DIR")        # a MarianTokenizer
model = AutoModelForSeq2SeqLM.from_pretrained("MODEL_DIR")    # a MarianMTModel
batch = tokenizer(["The cat sat on the mat."], return_tensors="pt", padding=True)
output = model.generate(**batch)                               # beam 4 by default
print(tokenizer.batch_decode(output, skip_special_tokens=True))
```

transformers 5 removed the "translation" pipeline; with transformers 4,
`pipeline("translation", model="MODEL_DIR")` loads this directory too.
`generate(num_beams=1)` gives nmt's greedy translations token for token. transformers'
`length_penalty` divides by length ** alpha, not nmt's GNMT ((5 + length) / 6) ** alpha,
so beam rankings may differ slightly.
"""


def import_transformers() -> Any:
    """The transformers package, or an NmtError saying how to install it."""
    return require("transformers", purpose="nmt export --to huggingface")


def check_exportable(cfg: ModelConfig) -> None:
    if cfg.pre_norm:
        raise NmtError(
            "--to huggingface: this model has pre-norm layers (model.pre_norm), and "
            "MarianMT's are post-norm only; export it --to ctranslate2"
        )
    if cfg.positions != "sinusoidal":
        raise NmtError(
            "--to huggingface: this model has learned positions, and MarianMT always uses "
            "fixed sinusoids (it rebuilds them when loading); export it --to ctranslate2"
        )
    if cfg.head_dim_k * cfg.n_heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k:
        raise NmtError(
            f"--to huggingface: MarianMT needs d_k = d_v = d_model / n_heads "
            f"({cfg.d_model // cfg.n_heads}); this model has d_k {cfg.head_dim_k}, "
            f"d_v {cfg.head_dim_v}"
        )
    if cfg.d_model % 2:
        raise NmtError("--to huggingface: d_model must be even for sinusoidal positions")


def marian_permutation(d_model: int) -> Tensor:
    """P with marian_table = our_table[:, P]: even (sin) dimensions first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(ckpt: Checkpoint) -> Any:
    transformers = import_transformers()
    cfg = ckpt.model_config
    return transformers.MarianConfig(
        vocab_size=cfg.src_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        share_encoder_decoder_embeddings=cfg.three_way_tying,
        tie_word_embeddings=True,
        max_position_embeddings=cfg.max_positions,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,  # transformers' "gelu" is the erf form
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.relu_dropout,
        scale_embedding=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,
    )


def marian_state(ckpt: Checkpoint) -> dict[str, Tensor]:
    """Our weights under MarianMT's names, every d_model axis permuted by P."""
    cfg, w = ckpt.model_config, ckpt.model
    perm = marian_permutation(cfg.d_model)

    def rows(t: Tensor) -> Tensor:  # an output (or 1-d) axis of size d_model
        return t.float()[perm].contiguous()

    def cols(t: Tensor) -> Tensor:  # an input axis of size d_model
        return t.float()[:, perm].contiguous()

    src, tgt = cols(w[ENCODER.tokens]), cols(w[DECODER.tokens])
    out: dict[str, Tensor] = {
        "model.encoder.embed_tokens.weight": src,
        "model.decoder.embed_tokens.weight": tgt,
        "lm_head.weight": tgt,
        "final_logits_bias": (
            w[OUTPUT_BIAS].float().reshape(1, -1)
            if cfg.output_bias
            else torch.zeros(1, cfg.tgt_vocab_size)
        ),
    }
    if cfg.three_way_tying:
        out["model.shared.weight"] = tgt
    table = sinusoidal_positions_marian(cfg)
    out["model.encoder.embed_positions.weight"] = table
    out["model.decoder.embed_positions.weight"] = table

    for role, theirs in marian_layer_names(cfg):
        for kind in KINDS:
            axis = role.axis(kind)
            parts = split(w[f"{role.name}.{kind}"].float(), role.parts, cfg)
            for name, part in zip(theirs, parts, strict=True):
                out[f"{name}.{kind}"] = (
                    rows(part) if axis == "rows" else cols(part) if axis == "cols" else part
                )
    return out


def marian_layer_names(cfg: ModelConfig) -> list[tuple[Role, list[str]]]:
    """Every layer module of ours (by role) and the MarianMT modules whose tensors it
    holds (several: a fused projection's parts, stacked in order). The one definition of
    Marian's side of the mapping: `nmt export` splits along it, `nmt import` stacks."""
    return [(role, fairseq_modules(role, "model.")) for role in roles(cfg)]


def sinusoidal_positions_marian(cfg: ModelConfig) -> Tensor:
    """Our exact table in Marian's layout (what Marian rebuilds, to float rounding)."""
    return sinusoidal_positions(cfg.max_positions, cfg.d_model)[:, marian_permutation(cfg.d_model)]


def build_marian(ckpt: Checkpoint) -> Any:
    """A MarianMTModel holding our weights (strictly: every weight set, none left over)."""
    transformers = import_transformers()
    check_exportable(ckpt.model_config)
    model = transformers.MarianMTModel(marian_config(ckpt))
    state = marian_state(ckpt)
    expected = set(model.state_dict())
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:  # a transformers version with other names: fail, never guess
        raise NmtError(
            f"--to huggingface: this transformers version names MarianMT's weights "
            f"differently (missing {missing[:3]}, unexpected {extra[:3]}); "
            "use the pinned version from constraints.txt"
        )
    model.load_state_dict(state, strict=True)
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        suppress_tokens=[PAD_ID, BOS_ID],
        num_beams=4,
        max_length=ckpt.model_config.max_positions,
    )
    return model.eval()


def save_tokenizer(ckpt: Checkpoint, out_dir: Path) -> None:
    """MarianTokenizer's files, written by MarianTokenizer itself from our vocabularies."""
    transformers = import_transformers()
    vocab = ckpt.vocab
    write_sentencepiece(out_dir, vocab.src, vocab.tgt)
    separate = not vocab.joint
    with tempfile.TemporaryDirectory() as tmp:
        src_json, tgt_json = Path(tmp) / "vocab.json", Path(tmp) / "target_vocab.json"
        write_json(src_json, {p: i for i, p in enumerate(all_pieces(vocab.src))})
        write_json(tgt_json, {p: i for i, p in enumerate(all_pieces(vocab.tgt))})
        pieces = all_pieces(vocab.tgt)
        tokenizer = transformers.MarianTokenizer(
            source_spm=str(out_dir / "source.spm"),
            target_spm=str(out_dir / "target.spm"),
            vocab=str(src_json),
            target_vocab_file=str(tgt_json) if separate else None,
            separate_vocabs=separate,
            unk_token=pieces[UNK_ID],
            eos_token=pieces[EOS_ID],
            pad_token=pieces[PAD_ID],
            bos_token=pieces[BOS_ID],
            model_max_length=ckpt.model_config.max_positions - 1,
        )
        tokenizer.save_pretrained(str(out_dir))


def export_huggingface(ckpt: Checkpoint, out_dir: Path) -> list[str]:
    """Write the MarianMT model, generation config and tokenizer into `out_dir` (which
    exists and is empty). Returns the files written."""
    model = build_marian(ckpt)
    model.save_pretrained(str(out_dir))
    save_tokenizer(ckpt, out_dir)
    (out_dir / "README.md").write_text(USAGE, encoding="utf-8")
    return sorted(p.name for p in out_dir.iterdir())
