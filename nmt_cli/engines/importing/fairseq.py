"""Import a fairseq `transformer` checkpoint (`transformer`, `transformer_wmt_en_de`,
`transformer_vaswani_wmt_en_de_big`, the WMT models of "Scaling Neural Machine
Translation") with its `dict.SRC.txt`, `dict.TGT.txt` and `bpecodes`.

fairseq's Transformer is the paper's, post-norm by default, and maps exactly, or is
refused by name:

- Layers: `encoder_normalize_before` and `decoder_normalize_before` (pre-norm layers,
  as `transformer_wmt_en_de_big_t2t` has them) are `model.pre_norm`, with fairseq's
  final `encoder.layer_norm` / `decoder.layer_norm` as nmt's `encoder_norm` /
  `decoder_norm`; one side pre-norm and the other post-norm, `no_decoder_final_norm`,
  `layernorm_embedding`, `no_scale_embedding`, an adaptive softmax,
  cross-self-attention and encoder and decoder of different sizes are refused. The
  attention projections come in either naming fairseq has written (q/k/v_proj, or one
  `in_proj_weight` of [Q; K; V] rows in checkpoints before 0.7, with `layer_norms.0/1`
  in the encoder); nmt's fused projections take the same rows.
- Activation: relu and gelu (fairseq's is the exact, erf, form) are `model.activation`.
- Positions: fairseq's sinusoids put sin in the first half and cos in the second with
  frequencies 10000^(-i / (d/2 - 1)), not the paper's 10000^(-2i / d), and count
  positions from padding_idx + 1. No permutation makes them nmt's table, so the import
  stores fairseq's exact table as learned positions (`model.positions = "learned"`),
  rows padding_idx + 1 onwards; learned positions are copied the same way.
- Embeddings: the output projection must be the decoder embedding
  (`share_decoder_input_output_embed` or `share_all_embeddings`); a separate one is
  refused. The source gets its own matrix (its Moses language differs from the
  target's, so the two vocabularies differ even when fairseq shares one dictionary).
- Tokens: fairseq's dictionary is <s> 0, <pad> 1, </s> 2, <unk> 3, then dict.txt's
  tokens; nmt's is pad 0, unk 1, <s> 2, </s> 3. fairseq starts decoding from </s>, so
  nmt's <s> is a copy of the </s> row with an output bias BOS_BIAS_GAP lower
  (common.py); fairseq's own <s>, which its softmax includes, stays an ordinary entry
  (nmt id 4, written "<s:fairseq>"), so nmt's distributions are fairseq's.
- Text: the vocabulary is Moses (the language of each side) + subword-nmt BPE, as
  fairseq's hub models read it (nmt_cli/moses_bpe.py), from `bpecodes`.

The checkpoint is read with `torch.load(weights_only=True)`: fairseq's configuration is
an `argparse.Namespace` (allowed as plain data) or, from fairseq 0.10 on, an omegaconf
`DictConfig`, whose classes are allowed when omegaconf is installed.
"""

from __future__ import annotations

import argparse
import math
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.core.layer_map import (
    DECODER,
    ENCODER,
    KINDS,
    OUTPUT_BIAS,
    STACKS,
    join,
    roles,
    split,
)
from nmt_cli.core.model_config import Activation, ModelConfig
from nmt_cli.core.vocab import BOS_ID, UNK_ID, VocabPair
from nmt_cli.engines.fairseq_names import PROJECTIONS, fairseq_modules
from nmt_cli.engines.importing.common import BOS_BIAS_GAP, Imported, ImportRefused, build_checkpoint
from nmt_cli.moses_bpe import describe

WHERE = "--from fairseq"
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary ids 0..3
PADDING_IDX = 1
# nmt id -> fairseq id of the four specials: pad, unk, <s> (fairseq starts from </s>), </s>
NMT_SPECIALS = (1, 3, 2, 2)
NMT_NAMES = ("<pad>", "<unk>", "<s>", "</s>")
FAIRSEQ_BOS = "<s:fairseq>"
ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "gelu": "gelu"}
# fairseq's defaults where a checkpoint's configuration leaves a key out (base_architecture;
# the big model's transformer_vaswani_wmt_en_de_big; its t2t variant is pre-norm).
BASE: dict[str, float] = {
    "encoder_embed_dim": 512,
    "encoder_ffn_embed_dim": 2048,
    "encoder_layers": 6,
    "encoder_attention_heads": 8,
    "dropout": 0.1,
}
BIG: dict[str, float] = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096}
BIG |= {"encoder_attention_heads": 16, "dropout": 0.3}
T2T: dict[str, float] = {"encoder_normalize_before": True, "decoder_normalize_before": True}
T2T |= {"attention_dropout": 0.1, "activation_dropout": 0.1}
ARCHES: dict[str, dict[str, float]] = {
    "transformer": BASE,
    "transformer_wmt_en_de": BASE,
    "transformer_vaswani_wmt_en_de_big": {**BASE, **BIG},
    "transformer_wmt_en_de_big": {**BASE, **BIG},
    "transformer_wmt_en_de_big_t2t": {**BASE, **BIG, **T2T},
    "transformer_vaswani_wmt_en_fr_big": {**BASE, **BIG, "dropout": 0.1},
}
# Settings nmt's Transformer does not have: refused when true (or set).
REFUSED = {
    "layernorm_embedding": "a LayerNorm on the embeddings",
    "no_scale_embedding": "unscaled embeddings (nmt scales by sqrt(d_model), section 3.4)",
    "adaptive_softmax_cutoff": "an adaptive softmax",
    "cross_self_attention": "cross-self-attention",
    "no_cross_attention": "a decoder without cross-attention",
    "no_token_positional_embeddings": "no positions",
    "adaptive_input": "adaptive input embeddings",
}


def refuse(message: str) -> ImportRefused:
    return ImportRefused(f"{WHERE}: {message}")


def import_fairseq(
    checkpoint: Path, data_dir: Path, languages: tuple[str, str] = ("", "")
) -> Imported:
    """The fairseq model in `checkpoint` as an nmt checkpoint (see the module docstring)."""
    raw = _load(checkpoint)
    args = _settings(raw)
    _check(args)
    state = raw["model"]
    if not isinstance(state, dict):
        raise refuse(f"{checkpoint}: no state dict under 'model'")
    src_lang = languages[0] or str(args.get("source_lang") or "")
    tgt_lang = languages[1] or str(args.get("target_lang") or "")
    if not (src_lang and tgt_lang):
        raise refuse("the checkpoint does not name its languages: pass --src and --tgt")
    if not data_dir.is_dir():
        raise refuse(f"--data-dir {data_dir}: not a directory")
    codes_path = data_dir / "bpecodes"
    if not codes_path.is_file():
        raise refuse(f"{data_dir}: no bpecodes (the subword-nmt BPE codes of the model)")
    codes = codes_path.read_text(encoding="utf-8")
    src_words = _dictionary(data_dir / f"dict.{src_lang}.txt")
    tgt_words = _dictionary(data_dir / f"dict.{tgt_lang}.txt")
    src_rows, src_vocab = _side(src_words, src_lang, codes)
    tgt_rows, tgt_vocab = _side(tgt_words, tgt_lang, codes)
    vocab = VocabPair.from_protos(src_vocab, tgt_vocab)

    d = int(args["encoder_embed_dim"])
    max_positions = max(int(args["max_source_positions"]), int(args["max_target_positions"]))
    cfg = ModelConfig(
        encoder_layers=int(args["encoder_layers"]),
        decoder_layers=int(args["decoder_layers"]),
        d_model=d,
        d_ff=int(args["encoder_ffn_embed_dim"]),
        n_heads=int(args["encoder_attention_heads"]),
        dropout=float(args["dropout"]),
        attention_dropout=float(args["attention_dropout"]),
        relu_dropout=float(args["activation_dropout"]),
        positions="learned",
        max_positions=max_positions,
        src_vocab_size=len(src_rows),
        tgt_vocab_size=len(tgt_rows),
        share_embeddings=True,
        joint_vocab=vocab.joint,
        activation=ACTIVATIONS[str(args["activation_fn"])],
        output_bias=True,
        pre_norm=bool(args.get("encoder_normalize_before")),
    )
    weights = _layers(state, cfg)
    src_embed = _get(state, "encoder.embed_tokens.weight")
    tgt_embed = _get(state, "decoder.embed_tokens.weight")
    for name, matrix, words in (("source", src_embed, src_words), ("target", tgt_embed, tgt_words)):
        if matrix.size(0) != len(words):
            raise refuse(
                f"the {name} embedding has {matrix.size(0)} rows but its dictionary "
                f"{len(words)} entries (with fairseq's 4 specials)"
            )
    _check_tied(state, tgt_embed)
    weights[ENCODER.tokens] = src_embed.float()[src_rows]
    weights[DECODER.tokens] = tgt_embed.float()[tgt_rows]
    for stack in STACKS:
        weights[stack.positions] = _positions(state, stack.side, max_positions, d)
    bias = torch.zeros(len(tgt_rows))
    bias[BOS_ID] = -BOS_BIAS_GAP
    weights[OUTPUT_BIAS] = bias
    notes = [
        "fairseq starts decoding from </s>; nmt's <s> is a copy of it whose output bias "
        f"is {BOS_BIAS_GAP:g} lower (probability ~1e-13 of it)",
        "fairseq's sinusoidal positions are not the paper's: stored as learned positions",
        "text is read with Moses and subword-nmt BPE, as fairseq's hub models read it",
    ]
    origin = {
        "imported_from": "fairseq",
        "checkpoint": checkpoint.name,
        "arch": str(args.get("arch", "")),
        "notes": notes,
    }
    ckpt = build_checkpoint(cfg, vocab, weights, (src_lang, tgt_lang), origin)
    return Imported(ckpt, tuple(notes))


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise refuse(f"{path}: no such checkpoint file")
    allowed: list[Any] = [argparse.Namespace]
    try:  # fairseq >= 0.10 pickles its configuration as omegaconf objects
        import omegaconf
        from omegaconf import base, nodes

        allowed += [omegaconf.DictConfig, omegaconf.ListConfig, base.ContainerMetadata]
        allowed += [base.Metadata, nodes.AnyNode, Any, dict, list, int]
    except ImportError:
        pass
    try:
        with torch.serialization.safe_globals(allowed):
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        hint = "; fairseq 0.10+ keeps an omegaconf configuration: pip install omegaconf"
        raise refuse(
            f"{path}: holds objects other than weights and plain data ({exc}){hint}"
        ) from None
    except Exception as exc:
        raise refuse(f"{path}: not a readable checkpoint ({exc})") from None
    if not isinstance(raw, dict) or "model" not in raw:
        raise refuse(f"{path}: not a fairseq checkpoint (no 'model')")
    return raw


def _settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The model's settings, whichever way fairseq stored them, over the arch defaults."""
    args = raw.get("args")
    found: dict[str, Any] = {}
    if isinstance(args, argparse.Namespace):
        found = vars(args)
    elif isinstance(args, dict):
        found = args
    cfg = raw.get("cfg")
    if not found and cfg is not None:
        found = {**_plain(cfg.get("task")), **_plain(cfg.get("model"))}
    if not found:
        raise refuse("the checkpoint has no model configuration ('args' or 'cfg')")
    arch = str(found.get("arch", found.get("_name", "transformer")))
    if arch not in ARCHES:
        raise refuse(f"arch {arch!r}: nmt imports {', '.join(sorted(ARCHES))}")
    merged = {**ARCHES[arch], **{k: v for k, v in found.items() if v is not None}}
    for side in ("decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads"):
        merged.setdefault(side, merged[side.replace("decoder", "encoder")])
    merged.setdefault("decoder_layers", merged["encoder_layers"])
    merged.setdefault("attention_dropout", 0.0)
    merged.setdefault("activation_dropout", merged.get("relu_dropout", 0.0))
    merged.setdefault("activation_fn", "relu")
    merged.setdefault("max_source_positions", 1024)
    merged.setdefault("max_target_positions", 1024)
    merged["arch"] = arch
    return merged


def _plain(node: Any) -> dict[str, Any]:
    """A `cfg` section as a dict: an OmegaConf node, a dict, or (fairseq 0.12's `cfg.model`
    for an architecture chosen with `--arch` on the command line) an argparse Namespace."""
    if node is None:
        return {}
    if isinstance(node, argparse.Namespace):
        return vars(node)
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(node):
            return dict(OmegaConf.to_container(node, resolve=True))
    except ImportError:
        pass
    return dict(node)


def _check(args: dict[str, Any]) -> None:
    for key, what in REFUSED.items():
        if args.get(key):
            raise refuse(f"{key} = {args[key]!r}: {what}, which nmt's Transformer does not have")
    pre = [bool(args.get(f"{side}_normalize_before")) for side in ("encoder", "decoder")]
    if pre[0] != pre[1]:
        raise refuse(
            f"encoder_normalize_before = {pre[0]} but decoder_normalize_before = {pre[1]}: "
            "nmt's layers are all pre-norm or all post-norm (model.pre_norm)"
        )
    if pre[1] and args.get("no_decoder_final_norm"):
        raise refuse("no_decoder_final_norm = True: nmt's pre-norm decoder ends with a LayerNorm")
    for ours in ("embed_dim", "ffn_embed_dim", "attention_heads"):
        enc, dec = args[f"encoder_{ours}"], args[f"decoder_{ours}"]
        if enc != dec:
            raise refuse(f"encoder_{ours} {enc} but decoder_{ours} {dec}: nmt's are one size")
    for key in ("decoder_output_dim", "decoder_input_dim"):
        if args.get(key) not in (None, args["encoder_embed_dim"]):
            raise refuse(f"{key} {args[key]} differs from the model's width")
    if args["activation_fn"] not in ACTIVATIONS:
        raise refuse(f"activation_fn {args['activation_fn']!r}: nmt implements relu, gelu")


def _check_tied(state: dict[str, Tensor], tgt_embed: Tensor) -> None:
    for name in ("decoder.output_projection.weight", "decoder.embed_out"):
        out = state.get(name)
        if out is not None and not torch.equal(out, tgt_embed):
            raise refuse(
                f"{name} is not the decoder embedding: nmt's output projection is that "
                "matrix (section 3.4); import a model trained with "
                "--share-decoder-input-output-embed or --share-all-embeddings"
            )


def _dictionary(path: Path) -> list[str]:
    """fairseq's Dictionary of `path`: its four specials, then one token per line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise refuse(f"{path}: missing (the model's dictionary)") from None
    words = list(SPECIALS)
    for number, line in enumerate(lines, 1):
        fields = line.rstrip().rsplit(" ", 2 if line.endswith("#fairseq:overwrite") else 1)
        if len(fields) < 2 or not fields[1].lstrip("-").isdigit():
            raise refuse(f"{path}:{number}: expected 'token count', got {line!r}")
        words.append(fields[0])
    return words


def _side(words: list[str], lang: str, codes: str) -> tuple[list[int], bytes]:
    """nmt's ids of one side: fairseq id of each, and the Moses + BPE description."""
    rows = [*NMT_SPECIALS, 0, *range(4, len(words))]
    names = [*NMT_NAMES, FAIRSEQ_BOS, *words[4:]]
    return rows, describe(lang, codes, names, UNK_ID)


def _get(state: dict[str, Tensor], name: str) -> Tensor:
    try:
        return state[name]
    except KeyError:
        raise refuse(f"the weights lack {name}") from None


def _positions(state: dict[str, Tensor], side: str, count: int, d: int) -> Tensor:
    """Positions 0..count-1 as fairseq adds them (its rows padding_idx + 1 onwards)."""
    learned = state.get(f"{side}.embed_positions.weight")
    first = PADDING_IDX + 1
    if learned is not None:
        if learned.size(0) < first + count:
            raise refuse(f"{side}.embed_positions has {learned.size(0) - first} positions")
        return learned.float()[first : first + count].clone()
    return fairseq_sinusoids(first + count, d, PADDING_IDX)[first:].clone()


def fairseq_sinusoids(rows: int, d: int, padding_idx: int) -> Tensor:
    """fairseq's SinusoidalPositionalEmbedding.get_embedding, computed as fairseq does
    (float32): sin in the first half, cos in the second, frequencies 10000^(-i/(h-1))."""
    half = d // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    angle = torch.arange(rows, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).view(rows, -1)
    if d % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[padding_idx, :] = 0
    return table


_IN_PROJ = ("q", "k", "v")
_OLD_NORMS = {".layer_norms.0.": ".self_attn_layer_norm.", ".layer_norms.1.": ".final_layer_norm."}


def _layers(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    state = _since_0_7(state, cfg)
    names = [(role.name, fairseq_modules(role)) for role in roles(cfg)]
    names += [(stack.final_norm, [f"{stack.side}.layer_norm"]) for stack in STACKS if cfg.pre_norm]
    return {
        f"{ours}.{kind}": join([_get(state, f"{name}.{kind}") for name in theirs]).float()
        for ours, theirs in names
        for kind in KINDS
    }


def _since_0_7(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """`state` under the names fairseq writes since 0.7: before, an attention's q, k and v
    were one `in_proj` of [Q; K; V] rows, and the encoder's norms `layer_norms.0/1`."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        module, fused, kind = name.rpartition(".in_proj_")
        if fused:
            for part, rows in zip(_IN_PROJ, split(tensor, _IN_PROJ, cfg), strict=True):
                out[f"{module}.{PROJECTIONS[part]}.{kind}"] = rows
            continue
        for old, new in _OLD_NORMS.items():
            name = name.replace(old, new)
        out[name] = tensor
    return out
