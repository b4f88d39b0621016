"""Pre-norm layers (`model.pre_norm`): x + Dropout(Sublayer(LayerNorm(x))) in every
sublayer and a final LayerNorm per stack, on every path that runs the layers (training's
forward, the incremental step, the written-out attention), while post-norm models keep
their parameter names and old checkpoints load as they were trained."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from decode_models import backend_decoder, random_model, wrap
from torch import Tensor

from nmt_cli.backends.cpu.decoder import CpuDecoder
from nmt_cli.core.checkpoint import Checkpoint, checkpoint_from_dict, model_state
from nmt_cli.core.parameters import count_parameters, parameter_breakdown
from nmt_cli.core.search import beam_search
from nmt_cli.core.transformer import DecoderLayer, EncoderLayer, ModelConfig, Transformer
from nmt_cli.core.vocab import VocabPair, train_sentencepiece

pytestmark = pytest.mark.usefixtures("one_thread")

FINAL_NORMS = ["encoder_norm.weight", "encoder_norm.bias"]
FINAL_NORMS += ["decoder_norm.weight", "decoder_norm.bias"]


def _model(cfg: ModelConfig, seed: int = 0, **changes: object) -> Transformer:
    """A random model whose LayerNorms are random too, so that a norm applied in the
    wrong place (or not at all) changes the output."""
    torch.manual_seed(seed)
    model = Transformer(dataclasses.replace(cfg, **changes)).double().eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    return model


def _batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 9), generator=g)
    src[1, 6:] = 0
    src[2, 4:] = 0
    return src, torch.randint(4, 40, (3, 7), generator=g)


def _norm(norm: torch.nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def test_a_pre_norm_layer_is_x_plus_its_sublayer_of_the_normalized_input(
    tiny_config: ModelConfig,
) -> None:
    """One encoder and one decoder layer written out by hand: each sublayer reads
    LayerNorm(x), its output is added to x unnormalized, and each stack ends in its own
    LayerNorm, the decoder's before the tied projection."""
    model = _model(tiny_config, encoder_layers=1, decoder_layers=1, pre_norm=True)
    src, tgt = _batch()
    enc, dec = model.encoder[0], model.decoder[0]
    assert isinstance(enc, EncoderLayer) and isinstance(dec, DecoderLayer)
    mask = model.source_mask(src)
    with torch.no_grad():
        x = model.src_embed(src)
        x = x + enc.self_attn(_norm(enc.norm1, x), key_mask=mask)[0]
        x = x + enc.ffn(_norm(enc.norm2, x))
        memory = _norm(model.encoder_norm, x)  # type: ignore[arg-type]
        y = model.tgt_embed(tgt)
        y = y + dec.self_attn(_norm(dec.norm1, y), causal=True)[0]
        y = y + dec.cross_attn(_norm(dec.norm2, y), memory, key_mask=mask)[0]
        y = y + dec.ffn(_norm(dec.norm3, y))
        logits = _norm(model.decoder_norm, y) @ model.output_weight.T  # type: ignore[arg-type]
        torch.testing.assert_close(model.encode(src), memory, rtol=0, atol=1e-12)
        torch.testing.assert_close(model(src, tgt), logits, rtol=0, atol=1e-12)
        post = _model(tiny_config, encoder_layers=1, decoder_layers=1)
        post.load_state_dict(model.state_dict(), strict=False)
        assert (post(src, tgt) - logits).abs().max() > 0.1  # the other model


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_pre_norm_incremental_decoding_equals_full_decoding(
    tiny_config: ModelConfig, activation: str
) -> None:
    """The step (with and without attention weights) and the written-out attention of
    pictures against teacher forcing, through a beam reorder."""
    model = _model(tiny_config, pre_norm=True, activation=activation)
    src, tgt = _batch()
    with torch.no_grad():
        full = model(src, tgt).log_softmax(-1)
        mask = model.source_mask(src)
        memory, _ = model.encode_with_attention(src, mask)
        explicit = model.decode(tgt, memory, mask, need_weights=True).hidden
        torch.testing.assert_close(model.logits(explicit).log_softmax(-1), full)
        cache = model.new_cache()
        for t in range(tgt.size(1)):
            if t == 3:
                cache.reorder(torch.tensor([2, 1, 0]), cross=True)
                order = torch.tensor([2, 1, 0])
                full, tgt, memory, mask = full[order], tgt[order], memory[order], mask[order]
            lp, weights = model.decode_step(tgt[:, t], memory, mask, cache, t % 2 == 0)
            torch.testing.assert_close(lp, full[:, t].float(), rtol=0, atol=1e-5)
            assert (weights is None) == (t % 2 == 1)


def test_post_norm_parameter_names_are_unchanged_and_pre_norm_adds_the_final_norms(
    tiny_config: ModelConfig,
) -> None:
    post = Transformer(tiny_config)
    pre = Transformer(dataclasses.replace(tiny_config, pre_norm=True))
    names = list(post.state_dict())
    assert [n for n in pre.state_dict() if n not in FINAL_NORMS] == names
    assert set(pre.state_dict()) - set(names) == set(FINAL_NORMS)
    breakdown = parameter_breakdown(pre)
    assert breakdown["total"] == count_parameters(pre) == count_parameters(post) + 4 * 32
    pre.train()
    src, tgt = _batch()
    pre(src, tgt).sum().backward()
    assert [n for n, p in pre.named_parameters() if p.grad is None] == []


@pytest.fixture(scope="module")
def vocab() -> VocabPair:
    words = ["cat", "dog", "tree", "house", "runs", "small"]
    lines = [" ".join(words[(i * 5 + j) % 6] for j in range(5)) for i in range(100)]
    proto = train_sentencepiece(lines, vocab_size=20)
    return VocabPair.from_protos(proto, proto)


def test_a_post_norm_checkpoint_from_before_the_setting_loads_as_it_was_trained(
    tiny_config: ModelConfig, vocab: VocabPair
) -> None:
    """A file written before `pre_norm` existed: no such key in its configuration, no
    final norms in its weights, format version 1. It rebuilds the post-norm model."""
    model = _model(tiny_config).float()
    raw = Checkpoint(model.cfg, vocab, model_state(model)).to_dict()
    assert raw["version"] == 1
    del raw["model_config"]["pre_norm"]
    old = checkpoint_from_dict(raw)
    assert old.model_config == tiny_config and not old.model_config.pre_norm
    src, tgt = _batch()
    with torch.no_grad():
        torch.testing.assert_close(old.build_model()(src, tgt), model(src, tgt), rtol=0, atol=0)
    pre = Transformer(dataclasses.replace(tiny_config, pre_norm=True))
    raw = Checkpoint(pre.cfg, vocab, model_state(pre)).to_dict()
    assert raw["version"] == 2  # a reader without pre_norm refuses it


def test_the_compiled_step_declines_pre_norm_and_the_reference_step_decodes_it(
    kernel: ModuleType,
) -> None:
    """One notice naming the setting, no compiled step, and the reference step's beams;
    the compiled (post-norm) step would have computed another model."""
    told: list[str] = []
    decoder = backend_decoder(random_model(pre_norm=True), "fp32", told.append)
    assert told == ["the compiled step does not implement model.pre_norm=True"]
    assert decoder.step is None and decoder.attention_kernel is None
    src = torch.randint(4, 50, (3, 8), generator=torch.Generator().manual_seed(2))
    src[:, -1] = 3
    reference = wrap(random_model(pre_norm=True), "fp32", kernel, structural=False)
    want = beam_search(reference, src, 3, max_len_b=10)
    got = beam_search(decoder, src, 3, max_len_b=10)
    assert [[(h.tokens, h.score) for h in s] for s in got] == [
        [(h.tokens, h.score) for h in s] for s in want
    ]
    forced = CpuDecoder(random_model(pre_norm=True), None, kernel)  # the step, told nothing
    assert [[h.tokens for h in s] for s in beam_search(forced, src, 3, max_len_b=10)] != [
        [h.tokens for h in s] for s in want
    ]
