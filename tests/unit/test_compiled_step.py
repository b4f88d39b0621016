"""The compiled (C++) decoder step is the Python step, bit for bit: every precision the
CPU decodes in, padded sources, beam reorders, sentences leaving the batch, ensembles;
the two sides name what they exchange (a field one side lacks stops it at load); a model
with settings the step does not implement decodes on the reference step; and where it
cannot be built, decoding falls back to the Python step and says why."""

from __future__ import annotations

import copy
import math
import os
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest
import torch
from decode_models import backend_decoder, decode_model, random_model, wrap
from reverser import reverse_batch
from torch import Tensor

from nmt_cli.backends.cpu import build
from nmt_cli.backends.cpu import linear as cpu_linear
from nmt_cli.backends.cpu.build import CompileError
from nmt_cli.backends.cpu.decoder import CpuDecoder, kernel_advance
from nmt_cli.backends.cpu.linear import (
    Fp32Linear,
    Fp32OnednnLinear,
    Int8Linear,
    PackedLinear,
    packed_bf16_available,
)
from nmt_cli.backends.cpu.slot_cache import SlotCache
from nmt_cli.backends.pytorch import fused_attention_under
from nmt_cli.core.beam_advance import Advance, decode_then_advance, force_eos, torch_advance
from nmt_cli.core.cache import DecoderCache
from nmt_cli.core.checkpoint import Checkpoint, model_state
from nmt_cli.core.ensemble import Ensemble
from nmt_cli.core.search import beam_search
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair
from nmt_cli.cpu_level import LEVELS
from nmt_cli.engines.models import build_decoder

pytestmark = pytest.mark.usefixtures("one_thread")


def _checkpoint(model: Transformer | CpuDecoder) -> Checkpoint:
    """The model's weights as a checkpoint; build_decoder reads no vocabulary of one."""
    core = model.model if isinstance(model, CpuDecoder) else model
    return Checkpoint(core.cfg, cast(VocabPair, None), model_state(core))


def _sources() -> Tensor:
    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, 50, (4, 9), generator=g)
    src[:, -1] = 3
    src[1, 6:] = 0
    src[1, 5] = 3
    src[3, 2:] = 0
    src[3, 1] = 3
    return src


def _python_step(models: list[CpuDecoder], run: Callable[[], list]) -> list:
    """`run()` with the models' compiled steps set aside: the Python step, over the same
    caches and kernels (attention, candidate selection) as the compiled one."""
    steps = [m.step for m in models]
    for m in models:
        m.step = None
    try:
        return run()
    finally:
        for m, step in zip(models, steps, strict=True):
            m.step = step


def _same_hypotheses(a: list, b: list) -> None:
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]
    assert [[(h.score, h.log_prob) for h in s] for s in a] == [
        [(h.score, h.log_prob) for h in s] for s in b
    ]


@pytest.mark.parametrize("rows", [1, 4, 5, 128])
@pytest.mark.parametrize(("k", "n"), [(32, 48), (64, 50), (256, 8)])
def test_the_few_row_bf16_kernel_computes_the_fused_products(
    kernel: ModuleType, rows: int, k: int, n: int
) -> None:
    """Against float64 arithmetic on the same bf16 inputs: within one bf16 rounding of
    the exact result (fp32 sums of a few dozen products are far more precise)."""
    if not kernel.bf16_kernel_available():
        pytest.skip("this CPU has no AVX-512 BF16")
    g = torch.Generator().manual_seed(rows * 1000 + n)
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    r = torch.randn(rows, n, generator=g).bfloat16()
    packed = PackedLinear.of(w, b, kernel)
    exact = x.double() @ w.double().T + b.double()
    for got, want in (
        (packed(x), exact),
        (packed.relu(x), exact.clamp(min=0)),
        (packed.add(x, r), exact + r.double()),
    ):
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        # bf16 keeps 8 significant bits: one rounding is at most 2^-8 relative
        assert torch.allclose(got.double(), want, rtol=2**-8, atol=1e-6)
    three_d = packed(x.view(1, rows, k))
    assert three_d.shape == (1, rows, n) and torch.equal(three_d[0], packed(x))


@pytest.mark.parametrize("level", ["native", "avx512", "avx2"])
@pytest.mark.parametrize("rows", [1, 4, 70])
@pytest.mark.parametrize(("k", "n"), [(32, 48), (30, 50), (1024, 8)])
def test_the_int8_kernel_quantizes_each_row_on_its_own(
    kernel_at: Callable[[str], ModuleType], level: str, rows: int, k: int, n: int
) -> None:
    """Close to the float product, the same for a row whatever the other rows hold, and
    the ReLU and residual forms fused; on each route's grids (`_int8_grids`). "Close":
    within twice the relative error rounding to the grids predicts, uniform noise of a
    twelfth of a step squared on each operand (about 1.1% with 8 bits on both here, 1.4%
    with 7-bit weights, 1.7% with 7 bits on both)."""
    kernel = kernel_at(level)
    if not kernel.int8_kernel_available():
        pytest.skip("this CPU has no AVX2")
    g = torch.Generator().manual_seed(rows + n)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    x, r = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
    layer = Int8Linear.of(w, b, kernel)
    exact = x @ w.T + b
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    x_levels, w_levels = _int8_grids(kernel)

    def noise(t: Tensor, levels: int) -> float:  # relative: grid step / sqrt(12) / rms
        return float(t.abs().amax() / levels / 12**0.5 / t.pow(2).mean().sqrt())

    predicted = (noise(x, x_levels) ** 2 + noise(w, w_levels) ** 2) ** 0.5
    assert ((y - exact).norm() / (exact - b).norm()) < 2 * predicted
    assert torch.equal(layer.relu(x), y.clamp(min=0))
    assert torch.allclose(layer.add(x, r), y + r, atol=1e-5)
    louder = x.clone()
    louder[1:] *= 100  # other rows' scales change, the first row's result does not
    assert torch.equal(layer(louder)[0], y[0])


def _int8_grids(kernel: ModuleType) -> tuple[int, int]:
    """The levels a side of zero of the int8 route at the module's level in force, for
    the activations and the weights, as int8_linear.cpp defines its routes: VNNI 8 bits
    and 8; AVX-512BW (no VNNI) 8 and 7, so that a pair of products fits 16 bits; AVX2 7
    and 7, so that two pairs do."""
    level = kernel.cpu_level()
    if level >= LEVELS.index("avx512_vnni"):
        return 127, 127
    return (127, 63) if level >= LEVELS.index("avx512") else (63, 63)


def _int8_reference(
    x: Tensor, w: Tensor, b: Tensor, x_levels: int, w_levels: int
) -> tuple[Tensor, Tensor]:
    """x W^T + b as the int8 kernel defines it, computed apart from it: each row of W
    quantized symmetrically to `w_levels` a side (w / scale, as the weights are packed)
    and each row of x to `x_levels` (x times 1 / scale, as each call quantizes its input),
    scale = max |.| / levels, rounded half to even in float32; the integer sums exact in
    int64, scaled in float64; and the bound of the kernel's float32 epilogue: the sum and
    the scale product each rounded once to float32 (2^-24 of the product each, and their
    product), the fused multiply-add with the bias once (2^-24 of the result)."""

    def quantized(t: Tensor, levels: int, by_inverse: bool) -> tuple[Tensor, Tensor]:
        scale = t.abs().amax(1) / float(levels)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
        steps = t * (1.0 / scale) if by_inverse else t / scale
        return torch.round(steps).clamp(-levels, levels).long(), scale[:, 0].double()

    (qx, sx), (qw, sw) = quantized(x, x_levels, True), quantized(w, w_levels, False)
    product = (qx @ qw.T).double() * sx[:, None] * sw[None, :]
    result = product + b.double()
    return result, 2.0**-24 * (2.01 * product.abs() + result.abs())


@pytest.mark.parametrize("level", ["native", "avx512", "avx2"])
@pytest.mark.parametrize(("rows", "k", "n"), [(1, 512, 512), (5, 41, 23), (9, 2048, 40)])
def test_the_int8_kernel_sums_exactly_where_16_bit_pairs_would_saturate(
    kernel_at: Callable[[str], ModuleType], level: str, rows: int, k: int, n: int
) -> None:
    """Every weight and every activation at the top of its range, half of them negative,
    and one row and one weight row all positive. On the AVX-512BW route (activations as
    bytes q + 128 up to 255, 7-bit weights up to 63) a pair of products is then
    2 x 255 x 63 = 32,130, at the edge of `vpmaddubsw`'s signed 16-bit sum (8-bit weights
    would saturate at 32,767); on the AVX2 route (bytes q + 64 up to 127, weights packed as
    w + 63 up to 126) a pair is 2 x 127 x 126 = 32,004, at the same edge, and two pairs
    added in 16 bits without a sign 64,008, at the edge of 65,535; on the VNNI route the
    sums are 32-bit throughout. Either way the sums of K of them are far past 16 bits. The
    result is the independent integer reference, at the route's grids, to the rounding of
    the float32 epilogue. Ragged K (an odd number of quads included) and N reach the
    tails, odd and even row counts each of the AVX2 tile's row shapes."""
    kernel = kernel_at(level)
    if not kernel.int8_kernel_available():
        pytest.skip("this CPU has no AVX2")
    g = torch.Generator().manual_seed(k)
    signs = lambda *shape: torch.randint(0, 2, shape, generator=g).float() * 2 - 1  # noqa: E731
    w = signs(n, k) * (1 + 0.001 * torch.rand(n, k, generator=g))
    x = signs(rows, k) * (1 + 0.001 * torch.rand(rows, k, generator=g))
    x[0] = w[0]  # one row the same signs as a weight row: every product at its maximum
    if rows > 1:  # every byte and packed weight at its top
        x[-1], w[-1] = x[-1].abs(), w[-1].abs()
    b = torch.randn(n, generator=g)
    want, bound = _int8_reference(x, w, b, *_int8_grids(kernel))
    got = Int8Linear.of(w, b, kernel)(x).double()
    assert ((got - want).abs() <= bound).all()
    assert got[0, 0] > 0.99 * k


def test_each_int8_route_sums_on_its_own_grids(kernel_at: Callable[[str], ModuleType]) -> None:
    """Random rows, whose 7-bit and 8-bit quantizations differ: each route's result is
    its own grids' reference's to the epilogue's rounding, not another route's, and the
    module says which grids it runs on (`int8_levels`, as `nmt env` would)."""
    g = torch.Generator().manual_seed(9)
    w, b = torch.randn(70, 300, generator=g), torch.randn(70, generator=g)
    x = torch.randn(13, 300, generator=g)
    for level in ("native", "avx512", "avx2"):  # VNNI; AVX-512BW alone; AVX2
        kernel = kernel_at(level)
        if not kernel.int8_kernel_available():
            pytest.skip("this CPU has no AVX2")
        assert tuple(kernel.int8_levels()) == _int8_grids(kernel)
        got = Int8Linear.of(w, b, kernel)(x).double()
        matches = set()
        for grids in ((127, 127), (127, 63), (63, 63)):
            want, bound = _int8_reference(x, w, b, *grids)
            if ((got - want).abs() <= bound).all():
                matches.add(grids)
        assert matches == {_int8_grids(kernel)}
    assert _int8_grids(kernel_at("avx2")) == (63, 63)


def test_weights_packed_for_one_int8_route_are_refused_by_the_other(
    kernel_at: Callable[[str], ModuleType],
) -> None:
    """8-bit weights on the AVX2 route would saturate its 16-bit pair sums, and signed
    ones would break its unsigned ones: a layer packed at one CPU level and called at
    another is an error that says so, never a result."""
    if not kernel_at("native").int8_vnni_available():
        pytest.skip("this CPU has one int8 route (no AVX-512 VNNI)")
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(24, 40, generator=g), torch.randn(3, 40, generator=g)
    for packed_at in ("native", "avx512", "avx2"):  # VNNI; AVX-512BW alone; AVX2
        for called_at in {"native", "avx512", "avx2"} - {packed_at}:
            layer = Int8Linear.of(w, None, kernel_at(packed_at))
            kernel_at(called_at)
            with pytest.raises(RuntimeError, match="packed for another CPU level's route"):
                layer(x)


def _fused_forms_within_k_roundings(
    layer: Fp32Linear, x: Tensor, r: Tensor, w: Tensor, b: Tensor
) -> None:
    """x W^T + b, its ReLU and r + it by `layer`, each within K + 2 roundings of 2^-24 of
    |x| |W|^T + |b| (+ |r|) of float64's, in float32 and of its shape."""
    k = w.size(1)
    exact = x.double() @ w.double().T + b.double()
    size = x.double().abs() @ w.double().abs().T + b.double().abs()
    for got, want, scale in (
        (layer(x), exact, size),
        (layer.relu(x), exact.clamp(min=0), size),
        (layer.add(x, r), exact + r.double(), size + r.double().abs()),
    ):
        assert got.shape == want.shape and got.dtype == torch.float32
        assert ((got.double() - want).abs() <= (k + 2) * 2.0**-24 * scale).all()


@pytest.mark.parametrize(("k", "n"), [(512, 40), (37, 23), (2048, 16)])
def test_the_fp32_kernel_is_the_exact_product_to_k_roundings_and_alike_in_any_batch(
    kernel_at: Callable[[str], ModuleType], k: int, n: int
) -> None:
    """Against float64: within K + 2 roundings of 2^-24 of |x| |W|^T + |b| (+ |r|), in each
    fused form; a row's result the same bits whatever rows share its tile (1 to 4 rows take
    different register tiles); from kernel_rows + 1 rows on, PyTorch's product, then the
    bias, the ReLU and the residual in one pass (each one rounding, as PyTorch's own)."""
    kernel = kernel_at("avx2")
    if not kernel.fp32_kernel_available():
        pytest.skip("this CPU has no AVX2")
    g = torch.Generator().manual_seed(k + n)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    x, r = torch.randn(7, k, generator=g), torch.randn(7, n, generator=g)
    layer = Fp32Linear.of(w, b, kernel)
    _fused_forms_within_k_roundings(layer, x, r, w, b)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(7)])
    assert all(torch.equal(layer(x[:rows]), alone[:rows]) for rows in range(1, 8))
    assert torch.equal(layer(x), alone)
    many = torch.randn(kernel.fp32_kernel_rows() + 1, k, generator=g)
    residual = torch.randn(many.size(0), n, generator=g)
    product = torch.mm(many, w.T) + b
    assert torch.equal(layer(many), product)
    assert torch.equal(layer.relu(many), product.clamp(min=0))
    assert torch.equal(layer.add(many, residual), residual + product)


@pytest.mark.parametrize(("k", "n"), [(512, 40), (37, 23)])
def test_onednns_fp32_products_of_many_rows_are_exact_to_k_roundings(
    kernel_at: Callable[[str], ModuleType], k: int, n: int
) -> None:
    """Fp32OnednnLinear (CPUs not Intel's): up to the kernel's rows the kernel's results,
    bit for bit; above them oneDNN's packed product with the bias, ReLU or residual fused,
    within K + 2 roundings of 2^-24 of |x| |W|^T + |b| (+ |r|) of float64's."""
    kernel = kernel_at("avx2")
    if not kernel.fp32_kernel_available() or not torch.backends.mkldnn.is_available():
        pytest.skip("this CPU has no AVX2, or this PyTorch no oneDNN")
    g = torch.Generator().manual_seed(k * n)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    layer, plain = Fp32OnednnLinear.of(w, b, kernel), Fp32Linear.of(w, b, kernel)
    assert layer.weight.is_mkldnn
    few = torch.randn(kernel.fp32_kernel_rows(), k, generator=g)
    assert torch.equal(layer(few), plain(few))
    rows = kernel.fp32_kernel_rows() * 4 + 3
    x, r = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
    _fused_forms_within_k_roundings(layer, x, r, w, b)
    assert layer.shape_free_rows() == kernel.fp32_kernel_rows()


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 8000), (3, 37), (1, 5)])
def test_the_fast_log_softmax_is_pytorchs_to_a_few_ulp(
    kernel_at: Callable[[str], ModuleType], level: str, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    """On AVX-512 (float32 and bf16 logits) and on AVX2 (float32; bf16 is PyTorch's there,
    where bf16 models decode on PyTorch's products)."""
    kernel = kernel_at(level)
    g = torch.Generator().manual_seed(shape[1])
    logits = (torch.randn(*shape, generator=g) * 4).to(dtype)
    logits[0, 0] = -200.0  # exp underflows to 0
    got = kernel.fast_log_softmax(logits)
    want = torch.log_softmax(logits, -1, dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == shape
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-5)
    if dtype == torch.float32 and shape[1] == 8000 and kernel.vectorized()["log_softmax"]:
        assert not torch.equal(got, want)  # its own passes, not PyTorch's under its name


@pytest.mark.parametrize("level", ["native", "generic"])
def test_models_on_the_modules_products_use_it_and_the_others_pytorchs(
    kernel_at: Callable[[str], ModuleType], level: str
) -> None:
    """fp32 takes the module's log-softmax with the module's products (AVX2 and up) and
    keeps PyTorch's with PyTorch's (below); bf16 takes it with its kernel."""
    kernel = kernel_at(level)
    logits = torch.randn(2, 50)
    fp32 = decode_model("fp32", kernel)
    assert (fp32.own_arithmetic is kernel) == (kernel.cpu_level() >= LEVELS.index("avx2"))
    own = fp32.own_arithmetic is not None
    want = kernel.fast_log_softmax(logits) if own else torch.log_softmax(logits, -1)
    assert torch.equal(fp32.log_probs(logits), want)
    bf16 = decode_model("bf16", kernel)
    if not kernel.bf16_kernel_available():
        assert bf16.own_arithmetic is None  # PyTorch's products: PyTorch's log-softmax
        pytest.skip("this CPU has no AVX-512 BF16")
    assert torch.equal(bf16.log_probs(logits), kernel.fast_log_softmax(logits))


def test_more_rows_than_the_kernel_takes_go_to_onednn(kernel: ModuleType) -> None:
    if not kernel.bf16_kernel_available():
        pytest.skip("this CPU has no AVX-512 BF16")
    torch.manual_seed(0)
    w, b = torch.randn(40, 32).bfloat16(), torch.randn(40).bfloat16()
    x = torch.randn(129, 32).bfloat16()
    with_kernel, onednn = PackedLinear.of(w, b, kernel), PackedLinear.of(w, b)
    assert torch.equal(with_kernel(x), onednn(x))


def test_a_decoder_says_up_to_how_many_rows_no_product_builds_a_kernel(
    kernel: ModuleType,
) -> None:
    """Beam search keeps finished sentences as filler only above these rows (`slots`):
    fp32 on MKL and the int8 kernel build no kernel per shape, oneDNN's bf16 and fp32
    products one per shape, the module's bf16 and fp32 kernels none up to their rows."""
    fp32 = decode_model("fp32", kernel)
    on_onednn = isinstance(fp32.projection, Fp32OnednnLinear)
    assert fp32.shape_free_rows() == (kernel.fp32_kernel_rows() if on_onednn else math.inf)
    assert decode_model("bf16").shape_free_rows() == 0  # oneDNN's packed products only
    if kernel.int8_kernel_available():
        assert decode_model("int8", kernel).shape_free_rows() == math.inf
    assert decode_model("int8").shape_free_rows() == 0
    if not kernel.bf16_kernel_available():
        pytest.skip("this CPU has no AVX-512 BF16")
    assert kernel.kernel_rows() == 128
    bf16 = decode_model("bf16", kernel)
    assert bf16.shape_free_rows() == 128
    # beam 4: 32 sentences fit 128 rows exactly; 33 take oneDNN's buckets (40 slots)
    assert [bf16.slots(n, 4) for n in (1, 3, 9, 32, 33, 41)] == [1, 3, 9, 32, 40, 48]
    # an ensemble keeps what its most constrained member keeps
    ensemble = Ensemble([bf16, decode_model("fp32", kernel)])
    assert [ensemble.slots(n, 4) for n in (32, 33)] == [32, 40]
    assert random_model().slots(33, 4) == 33  # the reference keeps no filler


@pytest.mark.parametrize(("sentences", "k", "vocab"), [(1, 4, 50), (3, 4, 8000), (5, 1, 7)])
def test_the_one_pass_candidate_selection_equals_topk(
    kernel: ModuleType, sentences: int, k: int, vocab: int
) -> None:
    g = torch.Generator().manual_seed(sentences * k)
    lprobs = torch.log_softmax(torch.randn(sentences * k, vocab, generator=g), -1)
    cum = -torch.rand(sentences * k, generator=g) * 10
    cum[1 % (sentences * k)] = float("-inf")  # a closed beam slot
    want = lprobs.clone().add_(cum.view(-1, 1)).view(sentences, -1).topk(k, dim=1)
    got = kernel.beam_topk(lprobs, cum, k)
    assert torch.equal(got[0], want[0])
    finite = want[0] > float("-inf")  # a -inf candidate's index is any (a dead slot)
    assert torch.equal(got[1][finite], want[1][finite])


@pytest.mark.parametrize(("sentences", "k", "vocab"), [(1, 4, 50), (3, 4, 8000), (5, 1, 7)])
def test_the_compiled_bookkeeping_equals_pytorchs(
    kernel: ModuleType, sentences: int, k: int, vocab: int
) -> None:
    """beam_advance against torch_advance: banned ids, candidates ending in EOS (one of
    them -inf, in a closed slot, which does not count as ended), histories, origins."""
    g = torch.Generator().manual_seed(sentences * vocab)
    rows = sentences * k
    lprobs = torch.log_softmax(torch.randn(rows, vocab, generator=g), -1)
    lprobs[::2, 3] += 10.0  # EOS among the best of every other beam
    lprobs[:, [0, 2]] += 5.0  # PAD and BOS would win were they not banned
    cum = -torch.rand(rows, generator=g) * 3
    cum[rows - 1] = float("-inf")
    history = torch.randint(4, vocab, (rows, 5), generator=g)
    want = torch_advance(lprobs.clone(), cum, history, k)
    got = kernel_advance(kernel)(lprobs.clone(), cum, history, k)
    assert got.any_ended == want.any_ended and bool(want.ended.any())
    for name in ("top_lp", "cum", "ended"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    live = want.top_lp > float("-inf")  # a -inf candidate's token is any (a dead slot)
    assert torch.equal(got.tokens[live], want.tokens[live])
    rows = live.view(-1)
    assert torch.equal(got.origin[rows], want.origin[rows])
    assert torch.equal(got.history[rows], want.history[rows])
    assert not bool((got.tokens[live] == 0).any() | (got.tokens[live] == 2).any())


def _unfused(
    kernel: ModuleType, logits: Tensor, cum: Tensor, history: Tensor, k: int, forced: Tensor | None
) -> Advance:
    """What search does without the fused step: the module's log-softmax, EOS forced on
    the marked rows, the module's bookkeeping."""
    lprobs = kernel.fast_log_softmax(logits)
    if forced is not None:
        force_eos(lprobs, forced.nonzero().squeeze(1))
    return kernel_advance(kernel)(lprobs, cum, history, k)


@pytest.mark.parametrize("level", ["native", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("sentences", "k", "vocab"), [(1, 4, 50), (3, 4, 8003), (5, 1, 7)])
def test_the_fused_log_softmax_and_choice_equal_the_two_steps_bit_for_bit(
    kernel_at: Callable[[str], ModuleType],
    level: str,
    dtype: torch.dtype,
    sentences: int,
    k: int,
    vocab: int,
) -> None:
    """beam_choose against fast_log_softmax, forcing EOS and beam_advance, at every level
    (bf16 logits below AVX-512 and everything at the generic level take the unfused steps
    inside the call): the same scores to the bit, the same tokens, origins and
    histories. Logits with ties (rounded to steps of 1/8), a row forced to EOS, closed
    beams, EOS and the banned PAD and BOS among the best, vocabularies off the vector width
    (tails). The same again from the open beams' logits alone (`logit_rows`), as a step
    that skips the closed beams' rows gives them."""
    kernel = kernel_at(level)
    g = torch.Generator().manual_seed(sentences * vocab)
    rows = sentences * k
    logits = (torch.randn(rows, vocab, generator=g) * 3 * 8).round() / 8
    logits[::2, 3] += 6.0  # EOS among the best of every other row
    logits[:, [0, 2]] += 9.0  # PAD and BOS would win were they not banned
    logits = logits.to(dtype)
    cum = (-torch.rand(rows, generator=g) * 3 * 8).round() / 8
    cum[[1, rows - 1]] = float("-inf")  # closed beams
    history = torch.randint(4, vocab, (rows, 5), generator=g)
    forced = torch.zeros(rows, dtype=torch.bool)
    forced[rows // 2] = True
    open_rows = cum.isfinite().nonzero().squeeze(1)
    place = torch.full((rows,), -1, dtype=torch.long)
    place[open_rows] = torch.arange(open_rows.numel())
    for marks in (None, forced):
        want = _unfused(kernel, logits, cum, history, k, marks)
        for computed, logit_rows in ((logits, None), (logits[open_rows], place)):
            chosen = kernel.beam_choose(computed, cum, history, k, 3, [0, 2], marks, logit_rows)
            got = Advance(*chosen)
            assert got.any_ended == want.any_ended
            for name in ("top_lp", "cum", "ended", "tokens", "origin", "history"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name
    if k > 1:  # the forced row's one candidate is EOS
        sentence = rows // 2 // k
        chosen = (got.origin.view(sentences, k)[sentence] == rows // 2) & (
            got.top_lp[sentence] > float("-inf")
        )
        assert bool((got.tokens[sentence][chosen] == 3).all())


def test_an_open_beam_without_its_logits_row_is_an_error(kernel: ModuleType) -> None:
    """`logit_rows` may leave out closed beams only: an open beam's row missing, or a row
    past the logits, is refused rather than read from elsewhere."""
    logits, history = torch.randn(3, 20), torch.randint(4, 20, (4, 2))
    cum = torch.tensor([0.0, -1.0, float("-inf"), -2.0])
    for rows in ([0, -1, -1, 2], [0, 1, -1, 3]):
        with pytest.raises(RuntimeError, match="open beam's logits row"):
            kernel.beam_choose(logits, cum, history, 2, 3, [0, 2], None, torch.tensor(rows))
    kernel.beam_choose(logits, cum, history, 2, 3, [0, 2], None, torch.tensor([0, 1, -1, 2]))


def test_candidate_selection_ranks_ties_by_index_and_fills_with_minus_inf(
    kernel: ModuleType,
) -> None:
    lprobs = torch.full((2, 5), float("-inf"))
    lprobs[0, [1, 3]] = -1.0  # a tie within a beam
    lprobs[1, 0] = -1.0  # and across beams
    lprobs[1, 4] = -0.5
    values, indices = kernel.beam_topk(lprobs, torch.zeros(2), 2)
    assert values.tolist() == [[-0.5, -1.0]] and indices.tolist() == [[9, 1]]
    one_finite = torch.full((2, 3), float("-inf"))
    one_finite[1, 2] = -2.0
    values, indices = kernel.beam_topk(one_finite, torch.zeros(2), 2)
    assert values.tolist() == [[-2.0, float("-inf")]] and indices.tolist() == [[5, 0]]


def _steps_agree(model: CpuDecoder) -> None:
    """Six steps of the compiled step against the Python step, each over its own cache,
    from the same tokens, with beam reorders: equal log-probabilities and caches, or an
    AssertionError. This is the test that holds the two steps together."""
    step, model.step = model.step, None
    assert step is not None
    src = _sources()
    python, compiled = model.new_cache(), model.new_cache()
    slotted = isinstance(python, SlotCache)
    mask = model.source_mask(src)
    try:
        with torch.inference_mode():
            memory = model.encode(src, mask)
            tokens = torch.tensor([2, 7, 9, 11])
            for position in range(6):
                expected, _ = model.decode_step(tokens, memory, mask, python)
                model.step = step
                got, _ = model.decode_step(tokens, memory, mask, compiled)
                model.step = None
                assert got.dtype == torch.float32
                assert torch.equal(got, expected), f"log-probabilities differ at {position}"
                for a, b in zip(python.layers, compiled.layers, strict=True):
                    # a SlotCache's buffers hold what the steps wrote, and garbage after that
                    written = (slice(None), slice(0, position + 1)) if slotted else (...,)
                    assert torch.equal(a.self_k[written], b.self_k[written])
                    assert torch.equal(a.self_v[written], b.self_v[written])
                assert python.length == compiled.length == position + 1
                tokens = got.argmax(-1)
                if position in (1, 2):  # two reorders in a row compose, then are applied once
                    order = torch.tensor([3, 0, 0, 2])
                    python.reorder(order, cross=False)
                    compiled.reorder(order, cross=False)
    finally:
        model.step = step


def _onednn_fp32(precision: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """ "fp32 on oneDNN": fp32 with the plan of a CPU that is not Intel's, whose layers
    take oneDNN's products above the kernel's rows (Fp32OnednnLinear)."""
    if precision != "fp32 on oneDNN":
        return precision
    monkeypatch.setattr(cpu_linear, "mkl_tuned", lambda *_: False)
    return "fp32"


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize(
    "precision", ["fp32", "fp32 on oneDNN", "bf16", "int8", "int8 without VNNI"]
)
def test_each_step_and_its_cache_equal_the_python_step(
    kernel_at: Callable[[str], ModuleType],
    precision: str,
    level: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With "int8 without VNNI" the layers are on PyTorch's quantized kernels, as on CPUs
    whose int8 the module cannot run, called from the compiled step through the
    dispatcher; fp32, bf16 and int8 decode over the SlotCache where the CPU runs the
    module's attention kernel and its products,
    else over the DecoderCache. At the AVX2 level none of the module's AVX-512 kernels
    runs: the step calls their AVX2 forms or PyTorch's."""
    kernel = kernel_at(level)
    precision = _onednn_fp32(precision, monkeypatch)
    if precision == "int8 without VNNI":
        model = wrap(random_model(), "int8", None)
        model = CpuDecoder(model.model, model.projection, kernel)
    else:
        model = decode_model(precision, kernel, compiled=True)
    # where the projection runs on the module's kernel (linear.py's planner)
    level = kernel.cpu_level()
    own = {
        "fp32": level >= LEVELS.index("avx2"),
        "bf16": level >= LEVELS.index("avx512_bf16"),
        "int8": level >= LEVELS.index("avx2"),
    }.get(precision, False)
    slotted = own and kernel.attention_kernel_available()
    assert isinstance(model.new_cache(), SlotCache if slotted else DecoderCache)
    _steps_agree(model)


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("precision", ["fp32", "fp32 on oneDNN", "bf16", "int8"])
def test_the_compiled_encoder_and_cross_cache_equal_pythons(
    kernel_at: Callable[[str], ModuleType],
    precision: str,
    level: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With PyTorch's fused attention in the encoder (what the CPU plan gives decoding),
    the compiled encoder's output over padded sources, and the cross-attention keys,
    values and padding bias it stores in a SlotCache, equal the Python encoder's and
    `store_memory`'s bit for bit. With core's reference attention (the other tests'
    models) the encoder stays in Python: the C++ side calls the fused kernel. The
    sources are 36 tokens: more rows than the fp32 kernel takes, so "fp32 on oneDNN"
    runs oneDNN's products on both sides."""
    kernel = kernel_at(level)
    onednn = precision == "fp32 on oneDNN"
    precision = _onednn_fp32(precision, monkeypatch)
    fused = fused_attention_under("auto")
    model = decode_model(precision, kernel, compiled=True, attention=fused)
    if onednn and kernel.fp32_kernel_available():
        assert isinstance(model.projection, Fp32OnednnLinear)
    assert model.compiled_encoder
    assert not decode_model(precision, kernel, compiled=True).compiled_encoder
    src = _sources()
    mask = model.source_mask(src)
    with torch.inference_mode():
        compiled = model.encode(src, mask)
        python = _python_step([model], lambda: [model.encode(src, mask)])[0]
        assert compiled.dtype == python.dtype
        assert torch.equal(compiled, python)
        caches = [model.new_cache(), model.new_cache()]
        if not isinstance(caches[0], SlotCache):
            return  # the reference cache is filled by its Python layers either way
        _python_step([model], lambda: [model._cache_memory(python, mask, caches[0])])
        model._cache_memory(python, mask, caches[1])
    for name in ("cross_k", "cross_v", "cross_bias"):
        for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(caches[0].table.sources, caches[1].table.sources)
    assert caches[1].layers[0].cross_bias is not None  # the sources are padded


def test_a_change_to_the_python_encoder_alone_is_caught(
    kernel: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference encoder changes (the feed-forward's hidden layer) and the C++ one
    does not: the equality test fails."""
    from nmt_cli.core.transformer import FeedForward

    original = FeedForward.hidden
    monkeypatch.setattr(FeedForward, "hidden", lambda self, x: original(self, x) * 1.001)
    with pytest.raises(AssertionError):
        test_the_compiled_encoder_and_cross_cache_equal_pythons(
            lambda _: kernel, "fp32", "native", monkeypatch
        )


def test_a_change_to_the_python_step_alone_is_caught(
    kernel: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference changes (here the feed-forward's residual, as a later edit of core
    might) and the C++ step does not: the equality test fails."""
    from nmt_cli.core.transformer import FeedForward

    original = FeedForward.step
    monkeypatch.setattr(FeedForward, "step", lambda self, *xs: original(self, *xs) * 1.001)
    with pytest.raises(AssertionError, match="log-probabilities differ"):
        _steps_agree(decode_model("fp32", kernel, compiled=True))


def test_the_two_sides_name_the_same_fields(kernel: ModuleType) -> None:
    from nmt_cli.backends.cpu.contract import STRUCTURES

    assert {k: sorted(v) for k, v in kernel.contract().items()} == {
        k: sorted(v) for k, v in STRUCTURES.items()
    }


@pytest.mark.parametrize(
    ("side", "message"),
    [("python", "layer.self_gate only in Python"), ("c++", "norm.gain only in C++")],
)
def test_a_field_on_one_side_only_stops_the_step_at_load_with_its_name(
    kernel: ModuleType, monkeypatch: pytest.MonkeyPatch, side: str, message: str
) -> None:
    from nmt_cli.backends.cpu import contract

    told: list[str] = []
    if side == "python":
        changed = {**contract.STRUCTURES, "layer": (*contract.STRUCTURES["layer"], "self_gate")}
        monkeypatch.setattr(contract, "STRUCTURES", changed)
        theirs = kernel
    else:
        table = kernel.contract()
        table["norm"] = [*table["norm"], "gain"]
        theirs = cast(ModuleType, type("Changed", (), {"contract": staticmethod(lambda: table)}))
    with pytest.raises(contract.ContractError, match=message):
        contract.check_contract(theirs)
    if side == "python":  # through the backend: one notice, the reference step
        ckpt = _checkpoint(random_model())
        model, _, _ = build_decoder(
            [ckpt], ["a"], torch.device("cpu"), "fp32", True, lambda text: None, told.append
        )
        assert isinstance(model, CpuDecoder) and model.step is None
        assert len(told) == 1 and message in told[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_kernels_give_the_same_search_on_two_threads(
    kernel: ModuleType, precision: str
) -> None:
    """The module is built with OpenMP, so its kernels split their work over PyTorch's
    threads: a process decoding on two threads (`--workers 1 --threads 2`) gets the
    hypotheses one thread gets (their scores to rounding: PyTorch's own products sum in
    another order on two threads)."""
    model = decode_model(precision, kernel, compiled=True)
    src = torch.randint(4, 50, (24, 11), generator=torch.Generator().manual_seed(9))
    src[:, -1] = 3

    def run() -> list:
        return beam_search(model, src, 4, max_len_b=12, nbest=2)

    one = run()
    torch.set_num_threads(2)  # the one_thread fixture restores the count
    two = run()
    assert [[h.tokens for h in s] for s in two] == [[h.tokens for h in s] for s in one]
    scores = [h.score for s in two for h in s]
    assert scores == pytest.approx([h.score for s in one for h in s], rel=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_beam_search_is_unchanged(kernel: ModuleType, precision: str, beam: int) -> None:
    model = decode_model(precision, kernel, compiled=True)
    src = _sources()
    assert model.step is not None

    def run() -> list:
        return beam_search(model, src, beam, max_len_b=12, nbest=beam)

    _same_hypotheses(run(), _python_step([model], run))
    if precision == "fp32" and model.own_arithmetic is None:  # PyTorch's products (AVX-512)
        _same_hypotheses(
            run(),
            beam_search(  # PyTorch's arithmetic with the module's candidate selection
                CpuDecoder(random_model(), None, kernel, structural=False),
                src,
                beam,
                max_len_b=12,
                nbest=beam,
            ),
        )


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("compiled", [True, False])
def test_search_on_the_fused_step_finds_what_the_reference_step_finds(
    kernel_at: Callable[[str], ModuleType], level: str, precision: str, compiled: bool
) -> None:
    """CpuDecoder.decode_advance (logits to the fused log-softmax and choice, where the
    log-softmax is the module's) against core's decode_then_advance over the same
    decoder: the same hypotheses and scores, with rows reaching their length limit
    (EOS forced) and sentences leaving the batch."""
    model = decode_model(precision, kernel_at(level), compiled=compiled)
    src = _sources()

    def run() -> list:
        return beam_search(model, src, 4, max_len_a=0.5, max_len_b=3, nbest=2)

    fused = run()
    model.decode_advance = partial(decode_then_advance, model)  # type: ignore[method-assign]
    _same_hypotheses(fused, run())
    if model.own_arithmetic is not None:
        assert "fused" in model.paths()["beam bookkeeping"]


def test_sentences_that_finish_leave_the_batch_the_same_way(
    kernel: ModuleType, reverser: Transformer
) -> None:
    """A trained model ends its sentences at different steps: the batch shrinks and the
    cross-attention cache is reordered between compiled steps."""
    model = copy.deepcopy(reverser).eval()
    src = reverse_batch(12, torch.Generator().manual_seed(1))[0]
    expected = beam_search(model, src, 4)
    _same_hypotheses(beam_search(CpuDecoder(model, None, kernel), src, 4), expected)


@pytest.mark.parametrize(("precision", "sentences"), [("fp32", 8), ("bf16", 8), ("int8", 24)])
def test_a_step_computes_the_open_beams_rows_alone_and_finds_the_same(
    kernel: ModuleType, reverser: Transformer, precision: str, sentences: int
) -> None:
    """A trained model's beams close as their hypotheses end (and finished sentences ride
    as filler): the compiled step then runs on the open beams' rows only, over a narrowed
    slot table, and search finds the hypotheses and scores of the step over every row,
    bit for bit. Rows the products take as they come (8 sentences x 4 beams for fp32 and
    bf16, which hand more to shape-bound products; any number for int8), so that no row's
    arithmetic depends on its neighbours."""
    model = wrap(reverser, precision, kernel, compiled=True)
    if model.own_arithmetic is None or model.step is None:
        pytest.skip(f"{precision} is on PyTorch's arithmetic here: every row is computed")
    src = reverse_batch(sentences, torch.Generator().manual_seed(3))[0]
    computed: list[int] = []
    logits = model._logits

    def counted(tokens: Tensor, *rest: object) -> Tensor:
        computed.append(tokens.numel())
        return logits(tokens, *rest)

    model._logits = counted  # type: ignore[method-assign]
    skipping = beam_search(model, src, 4, nbest=2)
    skipped_rows = sum(computed)
    computed.clear()
    model.open_rows_only = False
    _same_hypotheses(skipping, beam_search(model, src, 4, nbest=2))
    assert skipped_rows < sum(computed)


def test_an_int8_sentence_translates_the_same_alone_and_in_a_batch(kernel: ModuleType) -> None:
    model = decode_model("int8", kernel, compiled=True)
    if not kernel.int8_kernel_available():
        pytest.skip("this CPU has no AVX2: PyTorch's int8 scales the batch at once")
    src = torch.randint(4, 50, (5, 7), generator=torch.Generator().manual_seed(2))
    src[:, -1] = 3  # equal lengths: no padding, whose softmax sums differ in the last bit
    together = beam_search(model, src, 4, max_len_b=10)
    for i in range(src.size(0)):
        alone = beam_search(model, src[i : i + 1], 4, max_len_b=10)
        _same_hypotheses(alone, together[i : i + 1])


def test_separate_key_and_value_sizes_and_learned_positions(kernel: ModuleType) -> None:
    model = random_model(d_k=6, d_v=10, positions="learned")
    src = _sources()
    expected = beam_search(model, src, 3, max_len_b=10)
    compiled = CpuDecoder(model, None, kernel)
    assert compiled.step is not None
    _same_hypotheses(beam_search(compiled, src, 3, max_len_b=10), expected)


def test_an_ensemble_of_compiled_members_decodes_as_their_python_steps(
    kernel: ModuleType,
) -> None:
    members = [
        decode_model("bf16", kernel, seed=1, compiled=True),
        decode_model("bf16", kernel, seed=2, compiled=True),
    ]
    src = _sources()
    run = lambda: beam_search(Ensemble(members).eval(), src, 4, max_len_b=10)  # noqa: E731
    _same_hypotheses(run(), _python_step(members, run))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_weights_are_recorded_by_the_python_step(
    kernel: ModuleType, precision: str
) -> None:
    """fp32 on PyTorch's products: PyTorch's weights, as without the module; fp32 on the
    module's (AVX2): the same to float32's rounding; bf16: the attention kernel's, close to
    PyTorch's over the reference cache."""
    reference = beam_search(decode_model(precision), _sources(), 2, max_len_b=8, need_weights=True)
    model = decode_model(precision, kernel, compiled=True)
    got = beam_search(model, _sources(), 2, max_len_b=8, need_weights=True)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in reference]
    for a, b in zip(got, reference, strict=True):
        assert a[0].attention is not None and b[0].attention is not None
        for step_a, step_b in zip(a[0].attention, b[0].attention, strict=True):
            for x, y in zip(step_a, step_b, strict=True):
                if precision == "fp32" and model.own_arithmetic is None:
                    assert torch.equal(x, y)
                elif precision == "fp32":
                    assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)
                else:
                    assert x.shape == y.shape and torch.allclose(x, y, atol=2e-2)


def test_a_build_that_fails_is_reported_and_decoding_stays_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(report: Callable[[str], None] | None = None) -> ModuleType:
        assert report is not None
        report("building nmt's CPU kernels: 0/10 objects, 0 s")
        raise CompileError("no C++ compiler (c++) on PATH")

    monkeypatch.setattr(build, "load_kernel", broken)
    monkeypatch.setattr(build, "is_built", lambda: False)
    told: list[str] = []
    ckpt = _checkpoint(decode_model("fp32"))
    model, _, _ = build_decoder(
        [ckpt],
        ["a"],
        torch.device("cpu"),
        "bf16",
        compiled_step=True,
        on_compile=told.append,
        on_fallback=told.append,
    )
    assert told == [
        "building nmt's CPU kernels: 0/10 objects, 0 s",
        "the compiled step could not be built: no C++ compiler (c++) on PATH",
    ]
    assert isinstance(model, CpuDecoder) and model.step is None
    packed = model.model.decoder[0].ffn.w1
    if packed_bf16_available():  # packed for oneDNN alone, without the module's kernel
        assert isinstance(packed, PackedLinear) and packed.kernel is None
    else:
        assert type(packed) is torch.nn.Linear


def test_build_decoder_gives_cpu_models_the_compiled_step(kernel: ModuleType) -> None:
    ckpt = _checkpoint(decode_model("fp32"))
    told: list[str] = []
    model, _, _ = build_decoder([ckpt], ["a"], torch.device("cpu"), "bf16", True, told.append)
    assert told == []  # already built by the fixture
    assert isinstance(model, CpuDecoder) and model.step is not None
    plain, _, _ = build_decoder([ckpt], ["a"], torch.device("cpu"), "bf16", compiled_step=False)
    assert isinstance(plain, CpuDecoder) and plain.step is None


def test_the_build_is_cached_per_source_and_torch_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each PyTorch version and each source text has a cache entry (a directory under
    TORCH_EXTENSIONS_DIR) of its own, so a new PyTorch or a changed source never loads a
    stale build; the same of both finds the same entry again."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))

    def entry() -> Path:
        build._module_name.cache_clear()  # the name is computed once per process
        return build.build_directory()

    try:
        here = entry()
        assert here.parent == tmp_path and not build.is_built()
        assert torch.__version__ not in here.name  # hashed with the source text
        assert entry() == here  # the same torch and sources: the same entry
        with monkeypatch.context() as patch:
            patch.setattr(torch, "__version__", "2.99.0")
            newer = entry()
            patch.setattr(torch, "__version__", "2.98.0")
            older = entry()
        assert len({here, newer, older}) == 3 and {newer.parent, older.parent} == {tmp_path}
        assert entry() == here  # back on this PyTorch: its own entry again
        source = tmp_path / "csrc"
        shutil.copytree(build._CSRC, source)
        (source / "cpu_level.cpp").write_text((source / "cpu_level.cpp").read_text() + "\n")
        monkeypatch.setattr(build, "SOURCES", [source / p.name for p in build.SOURCES])
        monkeypatch.setattr(build, "INCLUDED", [source / p.name for p in build.INCLUDED])
        assert entry() not in {here, newer, older}  # one changed byte of one included file
    finally:
        monkeypatch.undo()
        build._module_name.cache_clear()


def test_each_source_directory_builds_its_own_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two installations of the same sources (their paths are in the builder's ninja
    file) would otherwise rebuild the one module in turn."""
    copy = tmp_path / "csrc"
    shutil.copytree(build._CSRC, copy)
    here = build._module_name()
    monkeypatch.setattr(build, "_CSRC", copy)
    monkeypatch.setattr(build, "SOURCES", [copy / p.name for p in build.SOURCES])
    monkeypatch.setattr(build, "INCLUDED", [copy / p.name for p in build.INCLUDED])
    build._module_name.cache_clear()
    try:
        assert build._module_name() != here
    finally:
        build._module_name.cache_clear()


def test_a_lock_left_by_a_killed_build_is_cleared(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("")
    build._clear_stale_lock(lock)
    assert lock.exists()  # a build may be running
    old = time.time() - build.STALE_LOCK_SECONDS - 1
    os.utime(lock, (old, old))
    build._clear_stale_lock(lock)
    assert not lock.exists()
    build._clear_stale_lock(lock)  # nothing to clear


def test_a_missing_source_file_is_a_fallback_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(build, "SOURCES", [tmp_path / "gone.cpp"])
    build._module_name.cache_clear()
    told: list[str] = []
    try:
        ckpt = _checkpoint(random_model())
        model, _, _ = build_decoder(
            [ckpt], ["a"], torch.device("cpu"), "fp32", True, lambda text: None, told.append
        )
    finally:
        build._module_name.cache_clear()
    assert isinstance(model, CpuDecoder) and model.step is None
    assert len(told) == 1 and "gone.cpp" in told[0]


def _silu_model(seed: int = 0) -> Transformer:
    """A Transformer whose feed-forward is SiLU (`model.activation`) instead of the
    paper's ReLU, which the compiled step does not implement."""
    return random_model(seed, activation="silu")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_model_with_a_setting_the_step_does_not_implement_decodes_on_the_reference(
    kernel: ModuleType, precision: str
) -> None:
    """One notice naming the setting, no compiled step and no attention kernel, and the
    reference step's output; the compiled step would have computed another model."""
    told: list[str] = []
    decoder = backend_decoder(_silu_model(), precision, told.append)
    assert told == ["the compiled step does not implement model.activation='silu'"]
    assert decoder.step is None and decoder.attention_kernel is None
    src = _sources()
    # the reference step over the same linear kernels and core's cache
    reference = wrap(_silu_model(), precision, kernel, compiled=False, structural=False)
    want = beam_search(reference, src, 3, max_len_b=10)
    _same_hypotheses(beam_search(decoder, src, 3, max_len_b=10), want)
    if precision == "fp32":
        forced = CpuDecoder(_silu_model(), None, kernel)  # the step, told nothing
        assert [[h.tokens for h in s] for s in beam_search(forced, src, 3, max_len_b=10)] != [
            [h.tokens for h in s] for s in want
        ]


def test_every_model_setting_is_declared_by_the_backend() -> None:
    """A setting added to core must be declared in backends/cpu/support.py (with the
    values the step implements) before the compiled step decodes models again."""
    import dataclasses

    from nmt_cli.backends.cpu.support import SUPPORTED, unsupported
    from nmt_cli.core.model_config import ModelConfig

    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(SUPPORTED)
    assert unsupported(ModelConfig(), "bf16") == []
    assert unsupported(ModelConfig(), "fp16") == ["precision=fp16"]


def test_int8_without_vnni_uses_seven_bit_activations_and_stays_accurate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The saturation risk is a missing VNNI, whatever the vector width (an AVX-512 CPU
    such as Skylake-SP has none): PyTorch's u8 x s8 pairs then sum into 16 bits. Inputs
    whose 8-bit pair sums would overflow 16 bits, against the float product."""
    from nmt_cli.backends.cpu import linear as linear_module

    skylake = tmp_path / "cpuinfo"
    skylake.write_text("processor: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512vl\n")
    cascade = tmp_path / "cpuinfo-vnni"
    cascade.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not linear_module.cpu_has_vnni(skylake)
    assert linear_module.cpu_has_vnni(cascade)
    monkeypatch.setattr(linear_module, "cpu_has_vnni", lambda: False)
    g = torch.Generator().manual_seed(3)
    w = torch.rand(16, 64, generator=g) + 1.0  # every weight near the top of its range
    x = torch.rand(4, 64, generator=g) + 1.0  # and every activation
    layer = Int8Linear.of(w, None)
    assert layer.reduce_range
    exact = x @ w.T
    assert ((layer(x) - exact).norm() / exact.norm()) < 0.02
