"""Decode-only linear layers: packed bf16 is exact (its fused ReLU and residual add
round once instead of twice), int8 is close, both decode the same.

And the float32 decoder step (attention written out in the cache, no fused kernel) gives
the same tokens and scores as recomputing every prefix through the teacher-forced path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from decode_models import random_model, wrap
from recompute import FullRecompute
from reverser import reverse_batch
from torch import Tensor, nn

from nmt_cli.backends.cpu import linear as cpu_linear
from nmt_cli.backends.cpu.decoder import CpuDecoder, cpu_decoders
from nmt_cli.backends.cpu.linear import (
    DecodeLinear,
    DecodeLinears,
    Fp32Linear,
    Fp32OnednnLinear,
    Int8Linear,
    PackedLinear,
    mkl_tuned,
    packed_bf16_available,
)
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.checkpoint import build_transformer
from nmt_cli.core.operations import REFERENCE
from nmt_cli.core.precision import resolve_decode_precision
from nmt_cli.core.search import beam_search, greedy_search
from nmt_cli.core.step_linear import linear, linear_add, linear_relu
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.cpu_level import LEVELS
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
    packed = PackedLinear.of(layer.weight, layer.bias)
    assert torch.equal(packed(x), layer(x))
    no_bias = PackedLinear.of(layer.weight, None)
    assert torch.equal(no_bias(x), F.linear(x, layer.weight))


@needs_mkldnn
def test_fused_relu_and_residual_add_round_once() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    residual = torch.randn(4, 48, dtype=torch.bfloat16)
    packed = PackedLinear.of(layer.weight, layer.bias)
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
    y = Int8Linear.of(layer.weight, layer.bias)(x)
    expected = layer(x).detach()
    assert y.dtype == torch.float32 and y.shape == expected.shape
    # 8-bit weights and activations: about 1% of the output's range, far from 0 or random
    error = (y - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.03


PRODUCT_SHAPES = [(48, 64), (48,), (5, 64), (5, 48)]  # weight, bias, input, residual


def _arithmetic_bound(
    layer: DecodeLinear, x: Tensor, w: Tensor, b: Tensor, residual: Tensor | None
) -> Tensor:
    """How far `layer`'s products may be from the exact ones (float64 on the same inputs),
    element by element, from its arithmetic: S = |x| |W|^T + |b| (+ |residual|) bounds
    every partial sum, and k = in_features terms are summed in float32 (at most k + 2
    roundings of 2^-24 of S). bf16 results are rounded once more, by at most half a unit
    of their last place: 2^-8 of the value. int8 rounds each weight to half a step of its
    row's grid (max |w| / 127, or / 63 on the module's routes without VNNI) and each
    activation to at most dx = the input's range / 126: the module's per-row grid of
    max |x| / 127, or / 63 on its AVX2 route, rounds to half a step, at most range / 126
    for a row holding both signs, and PyTorch's per-call affine grid of range / 255, or
    / 127 with 7 bits, to at most one step with its zero point; so a product is off by at
    most dw |x| + dx |w| + dw dx per term."""
    k = x.size(-1)
    x64, w64 = x.double(), w.double()
    added = torch.zeros(()) if residual is None else residual.double()
    size = x64.abs() @ w64.abs().T + b.double().abs() + added.abs()
    bound = (k + 2) * 2**-24 * size
    if isinstance(layer, PackedLinear):
        return bound + 2**-8 * (x64 @ w64.T + b.double() + added).abs()
    if not isinstance(layer, Int8Linear):  # float32 throughout
        return bound
    w_levels = 127 if layer.kernel is None else layer.kernel.int8_levels()[1]
    dw = (w64.abs().amax(1) / w_levels / 2)[None, :]  # one per output row
    dx = (x64.clamp(min=0).max() - x64.clamp(max=0).min()) / 126
    terms = dw * x64.abs().sum(1, keepdim=True) + dx * w64.abs().sum(1)[None, :] + k * dw * dx
    return bound + terms


@pytest.mark.parametrize("level", ["native", "avx512", "avx2"])
def test_each_implementation_equals_the_reference_within_its_arithmetic(
    kernel_at: Callable[[str], ModuleType], level: str
) -> None:
    """Every linear layer the CPU backend declares that runs here (at this CPU's level and
    at AVX2's), made as the planner makes it, against core's reference (`linear`,
    `linear_relu`, `linear_add` over an `nn.Linear`) in float64 on the same inputs: within
    `_arithmetic_bound`, in each of its three forms, and not merely the reference under
    another name (int8 is off)."""
    kernel = kernel_at(level)
    g = torch.Generator().manual_seed(11)
    ran = []
    for implementation in cpu_linear.implementations():
        precision = implementation.precision
        target = Target(torch.device("cpu"), False, kernel=kernel, precision=precision)
        if implementation.refuses(target) is not None:
            continue
        linears = implementation.make(target)
        assert isinstance(linears, DecodeLinears)
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        w, b, x, r = (torch.randn(*shape, generator=g).to(dtype) for shape in PRODUCT_SHAPES)
        layer = linears.of(w, b)
        exact = nn.Linear(64, 48).double()
        with torch.no_grad():
            exact.weight.copy_(w.double())
            exact.bias.copy_(b.double())
        plain, added = _arithmetic_bound(layer, x, w, b, None), _arithmetic_bound(layer, x, w, b, r)
        for got, want, bound in (
            (linear(layer, x), linear(exact, x.double()), plain),
            (linear_relu(layer, x), linear_relu(exact, x.double()), plain),
            (linear_add(layer, x, r), linear_add(exact, x.double(), r.double()), added),
        ):
            assert got.dtype == dtype and got.shape == want.shape
            assert ((got.double() - want).abs() <= bound).all(), implementation.name
        if precision == "int8":
            assert not torch.equal(linear(layer, x).double(), linear(exact, x.double()))
        ran.append(implementation.name)
    assert any("quantized" in name for name in ran)  # PyTorch's int8 runs everywhere
    if level == "avx2":  # the module's fp32 and int8 kernels run at AVX2
        assert any("AVX2 fp32" in name for name in ran)
        assert any("AVX2 kernel" in name for name in ran)


@pytest.mark.parametrize("level", ["native", "avx2", "generic"])
def test_fp32_decoding_takes_the_modules_products_wherever_avx2_runs(
    kernel_at: Callable[[str], ModuleType], level: str
) -> None:
    """From AVX2 up MKL's few-row products cost more than the arithmetic and the module's
    kernel takes them, with its log-softmax beside; below, PyTorch's products stay, exact,
    and so do PyTorch's log-softmax and attention."""
    kernel = kernel_at(level)
    target = Target(torch.device("cpu"), False, kernel=kernel, precision="fp32")
    chosen = machine_plan(target)
    decoder = wrap(random_model(), "fp32", kernel)
    if kernel.cpu_level() >= LEVELS.index("avx2"):
        # above the kernel's rows MKL's products on Intel's CPUs, oneDNN's on others
        layer = Fp32Linear if mkl_tuned() else Fp32OnednnLinear
        assert chosen.operations.linear == DecodeLinears(layer, kernel)
        assert type(decoder.projection) is layer
        assert decoder.own_arithmetic is kernel
    else:
        assert "it needs the CPU level avx2" in chosen.choice("linear").describe()
        assert decoder.projection is None and decoder.own_arithmetic is None


@pytest.mark.parametrize(
    ("vendor", "tuned"), [("GenuineIntel", True), ("AuthenticAMD", False), (None, True)]
)
def test_mkls_products_are_chosen_on_intels_cpus_only(
    tmp_path: Path, vendor: str | None, tuned: bool
) -> None:
    """The maker read from the CPU's description; unreadable, PyTorch's own (MKL's)."""
    cpuinfo = tmp_path / "cpuinfo"
    maker = "" if vendor is None else f"vendor_id\t: {vendor}\n"
    cpuinfo.write_text(f"processor\t: 0\n{maker}flags\t\t: fpu avx2 fma\n")
    assert mkl_tuned(cpuinfo) is tuned
    assert mkl_tuned(tmp_path / "missing") is True


def _module_types(model: nn.Module) -> dict[str, type]:
    return {name: type(module) for name, module in model.named_modules()}


def _parameters(model: nn.Module) -> dict[str, tuple[int, Tensor]]:
    return {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}


def _unchanged(model: nn.Module, types: dict[str, type], parameters: dict) -> bool:
    now = _parameters(model)
    return (
        _module_types(model) == types
        and now.keys() == parameters.keys()
        and all(
            now[n][0] == parameters[n][0] and torch.equal(now[n][1], parameters[n][1]) for n in now
        )
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_decoding_builds_its_model_and_changes_no_model(
    tiny_config: ModelConfig, precision: str
) -> None:
    """The model is built with the plan's linear layers and then only wrapped: neither
    the model whose weights it takes nor the one built is changed by the wrapping (types
    of every module, every parameter's storage and values)."""
    torch.manual_seed(0)
    reference = Transformer(tiny_config).eval()
    types, parameters = _module_types(reference), _parameters(reference)
    target = Target(torch.device("cpu"), False, precision=precision)
    operations = machine_plan(target).operations
    built = build_transformer(tiny_config, reference.state_dict(), operations)
    built_types, built_parameters = _module_types(built), _parameters(built)
    (decoder,) = cpu_decoders([built], operations.linear, None, precision)
    assert decoder.model is built and _unchanged(built, built_types, built_parameters)
    wrap(reference, precision)
    assert _unchanged(reference, types, parameters)


def test_an_int8_model_holds_no_float_weight_of_its_linear_layers(
    tiny_config: ModelConfig,
) -> None:
    """Each linear layer is an int8 one from the start and takes its weight as the
    checkpoint loads, so no float32 copy of what it multiplies with stays alive: the
    model's parameters are its embeddings and norms, and the tied projection is int8 too."""
    torch.manual_seed(0)
    reference = Transformer(tiny_config).eval()
    decoder = wrap(reference, "int8")
    linears = {n for n, m in reference.named_modules() if isinstance(m, nn.Linear)}
    assert linears and all(isinstance(decoder.model.get_submodule(n), Int8Linear) for n in linears)
    kept = {n for n, _ in decoder.model.named_parameters()}
    assert kept == {
        n for n, _ in reference.named_parameters() if n.rpartition(".")[0] not in linears
    }
    assert isinstance(decoder.projection, Int8Linear)
    assert decoder.projection.out_features == tiny_config.tgt_vocab_size


def test_a_checkpoint_of_another_shape_is_refused_by_a_decoding_layer(
    tiny_config: ModelConfig,
) -> None:
    weights = Transformer(tiny_config).state_dict()
    weights["decoder.0.ffn.w1.weight"] = weights["decoder.0.ffn.w1.weight"][:, :-1]
    del weights["decoder.0.ffn.w2.bias"]
    model = Transformer(tiny_config, replace(REFERENCE, linear=DecodeLinears(Int8Linear)))
    with pytest.raises(RuntimeError) as error:
        model.load_state_dict(weights)
    assert "decoder.0.ffn.w1.weight: (64, 31)" in str(error.value)
    assert 'Missing key(s) in state_dict: "decoder.0.ffn.w2.bias"' in str(error.value)


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
    packed = wrap(plain, "bf16")
    src, tgt = _batch(), torch.randint(4, 40, (5, 6), generator=torch.Generator().manual_seed(4))
    a, b = _decode_steps(packed, src, tgt), _decode_steps(plain, src, tgt)
    assert (a.exp() - b.exp()).abs().max() < 0.01
    assert not torch.equal(a, b)  # the fused path is the one that ran


@needs_mkldnn
def test_packed_bf16_keeps_a_trained_model_exact(reverser: Transformer) -> None:
    model = wrap(reverser, "bf16")
    src, _, tgt_out = reverse_batch(100, torch.Generator().manual_seed(123))
    expected = [[t for t in row.tolist() if t > 3] for row in tgt_out]
    assert [h[0].tokens for h in beam_search(model, src, beam_size=4)] == expected


def test_int8_model_scores_close_to_float32(tiny_config: ModelConfig) -> None:
    torch.manual_seed(0)
    fp32 = Transformer(tiny_config).eval()
    int8 = wrap(fp32, "int8")
    src, tgt = _batch(), torch.randint(4, 40, (5, 6), generator=torch.Generator().manual_seed(4))
    a, b = _decode_steps(fp32, src, tgt), _decode_steps(int8, src, tgt)
    assert (a.exp() - b.exp()).abs().max() < 0.02  # probabilities within two points


def test_int8_decoding_is_refused_on_a_gpu() -> None:
    with pytest.raises(NmtError, match="int8 runs on CPUs"):
        resolve_decode_precision("int8", torch.device("cuda"), "--precision")
    assert resolve_decode_precision("int8", torch.device("cpu"), "--precision") == "int8"


def test_int8_keeps_a_trained_model_exact(reverser: Transformer) -> None:
    model = wrap(reverser, "int8")
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
