"""Export to CTranslate2 through its own Python model specification.

The model is described with `ctranslate2.specs.TransformerSpec.from_config` and written
by the spec's `optimize` (aliasing shared weights, optional quantization) and `save`, the
path CTranslate2's own converters take; no binary is written by hand. How each part maps:

- Norms: `pre_norm` as `model.pre_norm`. Post-norm, CTranslate2 applies each sublayer's
  LayerNorm after the residual add, LayerNorm(x + Sublayer(x)), as our layers do, and
  has no final norm; pre-norm, on the sublayer's input, x + Sublayer(LayerNorm(x)), and
  its encoder and decoder `layer_norm` are our `encoder_norm` and `decoder_norm`.
  `layer_norm_epsilon` is set to torch's 1e-5 (CTranslate2's default differs).
- Feed-forward: `activation` RELU, SWISH (silu) or GELU (exact, erf) as
  `model.activation` says; w1 -> ffn.linear_0, w2 -> ffn.linear_1.
- Attention: our fused projections have CTranslate2's layout already. Self-attention's
  `qkv` rows are [Q; K; V], each h heads of d_k contiguous rows, which is what
  `linear[0]` of a CTranslate2 self-attention holds; cross-attention's `q` is `linear[0]`
  and its fused `kv` ([K; V]) is `linear[1]`; the output projection is the last linear.
  CTranslate2 splits heads as we do (h blocks of d_model / h), so d_k = d_v =
  d_model / h is required (a model with other d_k or d_v is refused).
- Embeddings: one matrix shared by source, target and the output projection when the
  vocabulary is joint (the spec's `optimize` stores it once and aliases the others);
  with separate vocabularies the source matrix is separate and the target one still
  doubles as the projection. `scale_embeddings` multiplies by sqrt(d_model) as we do.
  The projection has no bias, as ours, unless the model has `model.output_bias`.
- Never generated: nmt's search masks <pad> and <s> after the softmax. CTranslate2 has no
  such rule; a trained model gives them almost no probability, so they are not generated
  in practice, and the scores stay exactly ours. (A logit bias would enforce it but
  renormalize every step, and the scores would drift from nmt's; a user who decodes an
  untrained model can pass `suppress_sequences=[["<pad>"], ["<s>"]]`.)
- Positions: our exact table (sin on even, cos on odd dimensions, the paper's
  interleaving) is written as `position_encodings.encodings` for both encoder and
  decoder, so CTranslate2's own sinusoid generator (sin half / cos half) is never
  used; learned positions are written the same way.
- Tokens: source ids are our SentencePiece ids, with `add_source_eos` appending </s> as
  our encoder input does; decoding starts from <s> (our BOS) and ends with </s>.
  The vocabulary file lists every SentencePiece piece in id order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from nmt_cli.core.checkpoint import Checkpoint
from nmt_cli.core.layer_map import DECODER, KINDS, OUTPUT_BIAS, STACKS, Stack, roles
from nmt_cli.core.transformer import ModelConfig, sinusoidal_positions
from nmt_cli.core.vocab import BOS_ID, EOS_ID, UNK_ID
from nmt_cli.engines.export.output import all_pieces, write_sentencepiece
from nmt_cli.errors import NmtError, UsageError
from nmt_cli.optional import require

# CTranslate2's name of each sublayer in its layer spec. An attention's linear layers are
# its `linear` list in our order (self-attention [qkv, out], cross-attention [q, kv, out],
# our fused rows its layout), the feed-forward's are linear_0 and linear_1.
_SUBLAYERS = {"self_attn": "self_attention", "cross_attn": "attention", "ffn": "ffn"}
_NORM = ("gamma", "beta")  # a LayerNorm spec's weight and bias
# model.activation -> CTranslate2's Activation (its GELU is the exact, erf, form).
_ACTIVATIONS = {"relu": "RELU", "silu": "SWISH", "gelu": "GELU"}
QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


USAGE = """# CTranslate2 model exported by nmt

```python
import ctranslate2
import sentencepiece as spm

source = spm.SentencePieceProcessor(model_file="MODEL_DIR/source.spm")
target = spm.SentencePieceProcessor(model_file="MODEL_DIR/target.spm")
translator = ctranslate2.Translator("MODEL_DIR", device="cpu")  # compute_type="int8" to quantize
pieces = source.encode(["The cat sat on the mat."], out_type=str)
results = translator.translate_batch(pieces, beam_size=4, min_decoding_length=0)
print([target.decode(r.hypotheses[0]) for r in results])
```

</s> is appended to the source by the model's config; do not add it yourself.
`min_decoding_length=0` lets the first step end the output as nmt's search may (the
default, 1, renormalizes the first step without </s>). CTranslate2's `length_penalty`
divides by length ** alpha, not nmt's GNMT ((5 + length) / 6) ** alpha: with beam 1 the
two agree token for token; with beam 4 rankings may differ slightly.
"""


def import_ctranslate2() -> Any:
    """The ctranslate2 package, or an NmtError saying how to install it."""
    return require("ctranslate2", purpose="nmt export --to ctranslate2")


def check_exportable(cfg: ModelConfig) -> None:
    if cfg.head_dim_k * cfg.n_heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k:
        raise NmtError(
            f"CTranslate2 needs d_k = d_v = d_model / n_heads ({cfg.d_model // cfg.n_heads}); "
            f"this model has d_k {cfg.head_dim_k}, d_v {cfg.head_dim_v}"
        )


def build_spec(ckpt: Checkpoint) -> Any:
    """The filled-in TransformerSpec of a checkpoint (validated, not yet optimized)."""
    ct2 = import_ctranslate2()
    specs = ct2.specs
    check_exportable(ckpt.model_config)
    cfg, weights = ckpt.model_config, ckpt.model
    spec = specs.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.pre_norm,
        activation=getattr(specs.common_spec.Activation, _ACTIVATIONS[cfg.activation]),
    )
    for stack in STACKS:
        side = getattr(spec, stack.side)
        side.scale_embeddings = True
        side.position_encodings.encodings = _positions(ckpt, stack)
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        embeddings.weight = _np(weights[stack.tokens])
        if cfg.pre_norm:
            _set(side.layer_norm, weights, stack.final_norm, _NORM)
    spec.decoder.projection.weight = _np(weights[DECODER.tokens])
    if cfg.output_bias:
        spec.decoder.projection.bias = _np(weights[OUTPUT_BIAS])
    for role in roles(cfg):
        layer = getattr(spec, role.stack.side).layer[role.index]
        module = role.sublayer.module
        sublayer = getattr(layer, _SUBLAYERS[module])
        if role.linear is None:
            _set(sublayer.layer_norm, weights, role.name, _NORM)
        else:
            linears = [sublayer.linear_0, sublayer.linear_1] if module == "ffn" else sublayer.linear
            _set(linears[role.sublayer.linears.index(role.linear)], weights, role.name, KINDS)

    src_pieces, tgt_pieces = all_pieces(ckpt.vocab.src), all_pieces(ckpt.vocab.tgt)
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    config = spec.config
    config.unk_token = tgt_pieces[UNK_ID]
    config.bos_token = tgt_pieces[BOS_ID]
    config.eos_token = tgt_pieces[EOS_ID]
    config.decoder_start_token = tgt_pieces[BOS_ID]
    config.add_source_eos = True
    config.layer_norm_epsilon = 1e-5  # torch.nn.LayerNorm's
    spec.validate()
    return spec


def check_quantization(target: str, quantization: str) -> None:
    if quantization not in QUANTIZATIONS:
        raise UsageError(f"--quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)}")
    if target != "ctranslate2" and quantization != "float32":
        raise UsageError("--quantization applies to --to ctranslate2 only")


def export_ctranslate2(ckpt: Checkpoint, out_dir: Path, quantization: str) -> list[str]:
    """Write the CTranslate2 model and its SentencePiece models into `out_dir` (which
    exists and is empty). Returns the files written."""
    check_quantization("ctranslate2", quantization)
    spec = build_spec(ckpt)
    spec.optimize(quantization=quantization)
    spec.save(str(out_dir))
    write_sentencepiece(out_dir, ckpt.vocab.src, ckpt.vocab.tgt)
    (out_dir / "README.md").write_text(USAGE, encoding="utf-8")
    return sorted(p.name for p in out_dir.iterdir())


def _positions(ckpt: Checkpoint, stack: Stack) -> np.ndarray:
    cfg = ckpt.model_config
    if cfg.positions == "learned":
        return _np(ckpt.model[stack.positions])
    return sinusoidal_positions(cfg.max_positions, cfg.d_model).numpy()


def _set(spec: Any, weights: dict[str, Tensor], module: str, names: Sequence[str]) -> None:
    """`module`'s weight and bias as the spec's attributes `names`."""
    for name, kind in zip(names, KINDS, strict=True):
        setattr(spec, name, _np(weights[f"{module}.{kind}"]))


def _np(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()
