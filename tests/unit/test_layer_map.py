"""The layer map (core/layer_map.py) against the Transformer it describes: it names every
tensor of the state dict exactly once, for every setting that adds or removes tensors;
each role's shapes are what the map says (the d_model axis, the fused parts); and its
split of a fused projection is the one the model computes, which `join` undoes."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt_cli.core.layer_map import DECODER, ENCODER, join, parameter_names, roles, split
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.transformer import DecoderLayer, Transformer


def _config(**changes: object) -> ModelConfig:
    # d_k, d_v, d_ff and the layer counts all differ, so that a wrong size or a role
    # swapped between the stacks shows.
    base: dict[str, object] = dict(
        encoder_layers=3, decoder_layers=2, d_model=12, d_ff=20, n_heads=2, d_k=4, d_v=5
    )
    base |= dict(src_vocab_size=17, tgt_vocab_size=19, max_positions=9, joint_vocab=False)
    return ModelConfig(**{**base, **changes})  # type: ignore[arg-type]


SETTINGS = [
    dict(pre_norm=pre_norm, output_bias=bias, positions=positions, **vocab)
    for pre_norm, bias, positions, vocab in itertools.product(
        (False, True),
        (False, True),
        ("sinusoidal", "learned"),
        (dict(), dict(joint_vocab=True, tgt_vocab_size=17)),  # separate, then one matrix
    )
]


@pytest.mark.parametrize("changes", SETTINGS, ids=str)
def test_the_map_names_every_tensor_of_the_state_dict_once(changes: dict[str, object]) -> None:
    cfg = _config(**changes)
    names = parameter_names(cfg)
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(Transformer(cfg).state_dict())


def test_the_stacks_name_one_embedding_matrix_when_the_vocabulary_is_joint() -> None:
    tied = Transformer(_config(joint_vocab=True, tgt_vocab_size=17)).state_dict()
    assert tied[ENCODER.tokens].data_ptr() == tied[DECODER.tokens].data_ptr()
    separate = Transformer(_config()).state_dict()
    assert separate[ENCODER.tokens].shape == (17, 12)
    assert separate[DECODER.tokens].shape == (19, 12)


def test_each_role_has_the_shapes_the_map_gives_it() -> None:
    cfg = _config()
    model = Transformer(cfg)
    sizes = {"q": 2 * 4, "k": 2 * 4, "v": 2 * 5, "out": 12, "w1": 20, "w2": 12}
    seen = 0
    for role in roles(cfg):
        module = model.get_submodule(role.name)
        weight, bias = module.weight, module.bias
        if role.linear is None:
            assert isinstance(module, nn.LayerNorm)
            assert weight.shape == bias.shape == (cfg.d_model,)
        else:
            assert isinstance(module, nn.Linear)
            assert weight.size(0) == sum(sizes[part] for part in role.parts)
        for kind, tensor in (("weight", weight), ("bias", bias)):
            axis = role.axis(kind)
            if axis == "rows":
                assert tensor.size(0) == cfg.d_model
            elif axis == "cols":
                assert tensor.size(1) == cfg.d_model
            else:
                assert tensor.dim() == 1 and tensor.size(0) != cfg.d_model
        seen += 1
    # encoder: qkv, out, norm1, w1, w2, norm2; decoder: qkv, out, norm1, q, kv, out, norm2,
    # w1, w2, norm3
    assert seen == 3 * 6 + 2 * 10


def test_split_takes_the_fused_projections_apart_as_the_model_computes_them() -> None:
    cfg = _config()
    torch.manual_seed(0)
    layer = Transformer(cfg).decoder[1]
    assert isinstance(layer, DecoderLayer)
    x = torch.randn(3, 7, cfg.d_model)
    h = cfg.n_heads

    qkv, qkv_parts = layer.self_attn.qkv, ("q", "k", "v")
    weights, biases = split(qkv.weight, qkv_parts, cfg), split(qkv.bias, qkv_parts, cfg)
    parts = [F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)]
    assert [p.size(-1) for p in parts] == [h * 4, h * 4, h * 5]
    torch.testing.assert_close(torch.cat(parts, -1), qkv(x))

    kv = layer.cross_attn.kv
    k_weight, v_weight = split(kv.weight, ("k", "v"), cfg)
    k_bias, v_bias = split(kv.bias, ("k", "v"), cfg)
    keys, values = layer.cross_attn.project_kv(x)  # (B, h, S, d) each
    heads_k = F.linear(x, k_weight, k_bias).view(3, 7, h, 4).transpose(1, 2)
    heads_v = F.linear(x, v_weight, v_bias).view(3, 7, h, 5).transpose(1, 2)
    torch.testing.assert_close(heads_k, keys)
    torch.testing.assert_close(heads_v, values)


@pytest.mark.parametrize("parts", [("q", "k", "v"), ("k", "v"), ("q",), ("w1",)])
def test_join_undoes_split(parts: tuple[str, ...]) -> None:
    cfg = _config()
    rows = {"q": 8, "k": 8, "v": 10, "w1": 20}
    fused = torch.randn(sum(rows[p] for p in parts), cfg.d_model)
    pieces = split(fused, parts, cfg)
    assert [p.size(0) for p in pieces] == [rows[p] for p in parts]
    assert torch.equal(join(pieces), fused)
    bias = torch.randn(sum(rows[p] for p in parts))
    assert torch.equal(join(split(bias, parts, cfg)), bias)
