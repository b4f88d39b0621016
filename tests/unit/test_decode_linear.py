"""Decode-only linear layers: packed bf16 is exact (its fused ReLU and residual add
round once instead of twice), int8 is close, both decode the same.

And the float32 decoder step (attention written out in the cache, no fused kernel) gives
the same tokens and scores as recomputing every prefix through the teacher-forced path.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from recompute import FullRecompute
from reverser import reverse_batch
from torch import Tensor, nn

from nmt_cli.backends.cpu.decoder import CpuDecoder
from nmt_cli.backends.cpu.linear import (
    Int8Linear,
    PackedLinear,
    packed_bf16_available,
    specialise_linears,
)
from nmt_cli.core.precision import resolve_decode_precision
from nmt_cli.core.search import beam_search, greedy_search
from nmt_cli.core.step_linear import linear, linear_add, linear_relu
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")

needs_mkldnn = pytest.mark.skipif(
    not packed_bf16_available(), reason="oneDNN cannot pack bf16 weights on this CPU"
)


def _batch() -> Tensor:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (5, 8), generator=g)
    src[:, -1] = 3
    src[1, 5:] = 0
    src[1, 4] = 3
    src[3, 3:] = 0
    src[3, 2] = 3
    return src


@needs_mkldnn
@pytest.mark.parametrize("shape", [(4, 32), (3, 1, 32), (2, 5, 32)])
def test_packed_bf16_linear_equals_the_plain_one_bit_for_bit(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).to(torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    packed = PackedLinear(layer.weight, layer.bias)
    assert torch.equal(packed(x), layer(x))
    no_bias = PackedLinear(layer.weight, None)
    assert torch.equal(no_bias(x), F.linear(x, layer.weight))


@needs_mkldnn
def test_fused_relu_and_residual_add_round_once() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    residual = torch.randn(4, 48, dtype=torch.bfloat16)
    packed = PackedLinear(layer.weight, layer.bias)
    exact = F.linear(x.float(), layer.weight.float(), layer.bias.float())  # fp32 accumulation
    assert torch.equal(linear_relu(packed, x), exact.relu().bfloat16())
    summed = linear_add(packed, x, residual)
    assert torch.equal(summed, (exact + residual.float()).bfloat16())
    # the plain layer takes the unfused path: the same values up to one more rounding
    assert torch.equal(linear_relu(layer, x), F.relu(layer(x)))
    assert torch.equal(linear(layer, x), layer(x)) and torch.equal(linear(packed, x), layer(x))
    twice = linear_add(layer, x, residual)
    assert torch.equal(twice, residual + layer(x))
    torch.testing.assert_close(twice, summed, atol=0.05, rtol=0.01)


def test_int8_linear_is_within_quantization_error() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 96)
    x = torch.randn(7, 64)
    y = Int8Linear(layer.weight, layer.bias)(x)
    expected = layer(x).detach()
    assert y.dtype == torch.float32 and y.shape == expected.shape
    # 8-bit weights and activations: about 1% of the output's range, far from 0 or random
    error = (y - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.03


def test_specialise_swaps_every_linear_and_the_tied_projection(
    tiny_config: ModelConfig,
) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_config).eval()
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    projection = specialise_linears(model, "int8")
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == n_linear
    assert isinstance(projection, Int8Linear)
    assert projection.out_features == tiny_config.tgt_vocab_size


def _decode_steps(model: Transformer | CpuDecoder, src: Tensor, tgt: Tensor) -> Tensor:
    mask = model.source_mask(src)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        cache = model.new_cache()
        steps = [model.decode_step(tgt[:, t], memory, mask, cache)[0] for t in range(tgt.size(1))]
    return torch.stack(steps, 1)


@needs_mkldnn
def test_packed_bf16_model_decodes_as_the_plain_bf16_model(tiny_config: ModelConfig) -> None:
    """Fusing the residual adds into the products rounds once where the plain model
    rounds twice: the same log-probabilities up to bf16 rounding."""
    torch.manual_seed(0)
    plain = Transformer(tiny_config).eval().to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    packed = CpuDecoder(packed, specialise_linears(packed, "packed-bf16"))
    src, tgt = _batch(), torch.randint(4, 40, (5, 6), generator=torch.Generator().manual_seed(4))
    a, b = _decode_steps(packed, src, tgt), _decode_steps(plain, src, tgt)
    assert (a.exp() - b.exp()).abs().max() < 0.01
    assert not torch.equal(a, b)  # the fused path is the one that ran


@needs_mkldnn
def test_packed_bf16_keeps_a_trained_model_exact(reverser: Transformer) -> None:
    core = copy.deepcopy(reverser).to(torch.bfloat16)
    model = CpuDecoder(core, specialise_linears(core, "packed-bf16"))
    src, _, tgt_out = reverse_batch(100, torch.Generator().manual_seed(123))
    expected = [[t for t in row.tolist() if t > 3] for row in tgt_out]
    assert [h[0].tokens for h in beam_search(model, src, beam_size=4)] == expected


def test_int8_model_scores_close_to_float32(tiny_config: ModelConfig) -> None:
    torch.manual_seed(0)
    fp32 = Transformer(tiny_config).eval()
    int8 = Transformer(tiny_config).eval()
    int8.load_state_dict(fp32.state_dict())
    int8 = CpuDecoder(int8, specialise_linears(int8, "int8"))
    src, tgt = _batch(), torch.randint(4, 40, (5, 6), generator=torch.Generator().manual_seed(4))
    a, b = _decode_steps(fp32, src, tgt), _decode_steps(int8, src, tgt)
    assert (a.exp() - b.exp()).abs().max() < 0.02  # probabilities within two points


def test_int8_decoding_is_refused_on_a_gpu() -> None:
    with pytest.raises(NmtError, match="int8 runs on CPUs"):
        resolve_decode_precision("int8", torch.device("cuda"), "--precision")
    assert resolve_decode_precision("int8", torch.device("cpu"), "--precision") == "int8"


def test_int8_keeps_a_trained_model_exact(reverser: Transformer) -> None:
    core = copy.deepcopy(reverser)
    model = CpuDecoder(core, specialise_linears(core, "int8"))
    src, _, tgt_out = reverse_batch(100, torch.Generator().manual_seed(123))
    expected = [[t for t in row.tolist() if t > 3] for row in tgt_out]
    assert [h[0].tokens for h in beam_search(model, src, beam_size=4)] == expected


def test_float32_search_equals_recomputing_every_prefix(reverser: Transformer) -> None:
    """Three hundred sentences of a trained model, beam 4 with 4-best lists: the fast
    decoder step finds the same hypotheses, in the same order, with the same scores to
    float32 rounding. The two sum their products in different orders (one query against a
    cache, every position at once); each of a score's <= 9 steps sums dot products of
    d_model = 32 terms, so the scores may differ by up to ~9 * 32 float32 ulps of their
    size: rel 9 * 32 * 2**-23 = 3.4e-5."""
    src, _, _ = reverse_batch(300, torch.Generator().manual_seed(7), max_len=7)
    fast = beam_search(reverser, src, beam_size=4, nbest=4, max_len_b=8)
    slow = beam_search(FullRecompute(reverser), src, beam_size=4, nbest=4, max_len_b=8)
    assert [[h.tokens for h in s] for s in fast] == [[h.tokens for h in s] for s in slow]
    for a, b in zip(fast, slow, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=9 * 32 * 2**-23)
    greedy = greedy_search(reverser, src, max_len_b=8)
    slow_greedy = beam_search(FullRecompute(reverser), src, beam_size=1, max_len_b=8)
    assert [g[0].tokens for g in greedy] == [s[0].tokens for s in slow_greedy]
