"""The training fast paths: the cheaper CPU dropout (core's mask, the reference, and the
CPU backend's compiled one, held to the same tests), the loss's sweep over the logits
(core's chunked one, the reference, and the compiled one, held to autograd's loss),
attention (core's written-out one, the reference, and the compiled one, held to float64)
and the feed-forward's bias and ReLU (core's linear layer and ReLU, the reference, and
the compiled passes around PyTorch's product)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from nmt_cli.backends.cpu import training as cpu_kernels_module
from nmt_cli.backends.cpu.training import (
    compiled_attention,
    compiled_biased_attention,
    compiled_dense_relu,
    compiled_dropout_add,
    compiled_keep_mask,
    compiled_loss_sweep,
    training_kernel,
)
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.attention import Attention, biased_attention
from nmt_cli.core.attention import attention as written_out_attention
from nmt_cli.core.dropout import Dropout, KeepMask, masked_dropout_add, scaled_keep_mask
from nmt_cli.core.losses import LossSweep, label_smoothed_sums, smoothed_loss_sweep
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.operations import Operations
from nmt_cli.core.step_linear import dense_relu
from nmt_cli.core.transformer import Transformer


@pytest.fixture(params=["reference", "compiled"])
def keep_mask(request: pytest.FixtureRequest) -> KeepMask:
    """Each mask a CPU run can draw from: core's, and the CPU backend's compiled one."""
    if request.param == "reference":
        return scaled_keep_mask
    return compiled_keep_mask(request.getfixturevalue("kernel"))


def _capped(request: pytest.FixtureRequest) -> ModuleType:
    """The module for a "compiled" or "compiled-<level>" fixture parameter."""
    level = request.param.partition("-")[2] or "native"
    capped: ModuleType = request.getfixturevalue("kernel_at")(level)
    return capped


@pytest.fixture(params=["reference", "compiled", "compiled-avx2", "compiled-generic"])
def loss_sweep(request: pytest.FixtureRequest) -> LossSweep:
    """Each loss sweep a CPU run can use: core's, and the CPU backend's compiled one at
    this CPU's level, at AVX2's (eight lanes) and at the plain loops every CPU runs."""
    if request.param == "reference":
        return smoothed_loss_sweep
    return compiled_loss_sweep(_capped(request))


def test_dropout_drops_p_and_scales_the_rest(keep_mask: KeepMask) -> None:
    torch.manual_seed(0)
    drop = Dropout(0.1, keep_mask).train()
    x = torch.ones(200, 500, requires_grad=True)
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(0.1, abs=0.005)
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    y.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, y.detach())  # gradient is the same scaled mask


def test_dropout_is_reproducible_from_the_seed_and_off_in_eval(keep_mask: KeepMask) -> None:
    drop = Dropout(0.3, keep_mask).train()
    x = torch.randn(64, 32)
    torch.manual_seed(7)
    a = drop(x)
    torch.manual_seed(7)
    b = drop(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, drop(x))  # the next mask is another
    assert torch.equal(drop.eval()(x), x)


def test_dropout_add_is_residual_plus_dropout(keep_mask: KeepMask) -> None:
    drop = Dropout(0.2, keep_mask).train()
    residual = torch.randn(30, 16, requires_grad=True)
    x = torch.randn(30, 16, requires_grad=True)
    torch.manual_seed(3)
    out = drop.add(residual, x)
    torch.manual_seed(3)
    mask = drop(torch.ones(30, 16))
    torch.testing.assert_close(out, residual + x * mask)
    out.sum().backward()
    assert residual.grad is not None and x.grad is not None
    assert torch.equal(residual.grad, torch.ones_like(residual))
    torch.testing.assert_close(x.grad, mask)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_compiled_mask_has_the_references_distribution(
    kernel: ModuleType, p: float, dtype: torch.dtype
) -> None:
    """Same values and dtype as the reference; drop rate p within 5 standard deviations
    over a million elements, in every quarter of the 64-bit words (the four 16-bit parts
    of one random word decide four neighbours) and with neighbours independent."""
    like = torch.empty(1000, 1001, dtype=dtype)  # not a multiple of 4: a partial last word
    mask = kernel.scaled_keep_mask(like, p, 12345)
    reference = scaled_keep_mask(like, p)
    assert mask.dtype == dtype and mask.shape == like.shape
    assert set(mask.unique().tolist()) == set(reference.unique().tolist())
    dropped = (mask == 0).flatten().double()
    sd = math.sqrt(p * (1 - p) / dropped.numel())
    assert dropped.mean().item() == pytest.approx(p, abs=5 * sd)
    for quarter in range(4):
        share = dropped[quarter::4].mean().item()
        assert share == pytest.approx(p, abs=5 * sd * 2)
    both = (dropped[:-1] * dropped[1:]).mean().item()
    assert both == pytest.approx(p * p, abs=5 * sd)


def test_the_compiled_mask_follows_its_seed_not_the_threads(kernel: ModuleType) -> None:
    like = torch.empty(257, 129)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.scaled_keep_mask(like, 0.1, 99)
        torch.set_num_threads(2)
        two = kernel.scaled_keep_mask(like, 0.1, 99)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    other = kernel.scaled_keep_mask(like, 0.1, 100)
    assert not torch.equal(one, other)
    # Small and empty tensors: every element decided, no word past the end written.
    for shape in [(1,), (3,), (5,), (0, 4)]:
        small = kernel.scaled_keep_mask(torch.empty(shape), 0.5, 7)
        assert small.shape == shape and bool(((small == 0) | (small == 2)).all())
    with pytest.raises(RuntimeError, match="p must be"):
        kernel.scaled_keep_mask(like, 1.0, 1)


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_masks_vector_loops_are_the_plain_loops_bit_for_bit(
    kernel_at: Callable[[str], ModuleType], level: str, dtype: torch.dtype
) -> None:
    """Eight (AVX-512) or four (AVX2) words of SplitMix64 at a time are the plain loop's
    words: the same mask at every level, for each dtype, every size up to a few vectors
    past a thread's chunk and its tails, and every p, from keeping all (p = 0) to the
    threshold a 16-bit comparison cannot hold (p within 2^-17 of 1: all dropped)."""
    sizes = [1, 3, 4, 5, 31, 32, 33, 64, 65, 127, 129, 4096 * 4 + 37]
    for p in (0.0, 0.1, 0.5, 0.99999):
        for n in sizes:
            like = torch.empty(n, dtype=dtype)
            plain = kernel_at("generic").scaled_keep_mask(like, p, 2**40 + n)
            vector = kernel_at(level).scaled_keep_mask(like, p, 2**40 + n)
            assert torch.equal(vector, plain), (p, n)
    assert bool((kernel_at(level).scaled_keep_mask(torch.empty(99), 0.99999, 1) == 0).all())


def test_training_on_a_cpu_draws_its_masks_from_the_compiled_module(kernel: ModuleType) -> None:
    loaded, why = training_kernel()
    assert loaded is kernel and why == ""
    chosen = machine_plan(Target(torch.device("cpu"), True, kernel=loaded))
    keep = chosen.operations.keep_mask
    assert keep is not scaled_keep_mask and keep is not None
    assert chosen.operations.loss_sweep is not smoothed_loss_sweep
    assert chosen.operations.dense_relu is not dense_relu
    assert chosen.operations.dropout_add is not None
    assert "keep_mask: the module's counter-based generator" in chosen.describe()
    settings = dict(d_model=16, d_ff=32, n_heads=2, encoder_layers=1, decoder_layers=1)
    cfg = ModelConfig(**settings, src_vocab_size=20, tgt_vocab_size=20)  # type: ignore[arg-type]
    model = Transformer(cfg, chosen.operations)
    drops = [m for m in model.modules() if isinstance(m, Dropout)]
    assert drops and all(m.keep_mask is keep for m in drops)


def test_without_the_module_training_plans_the_references_and_says_why() -> None:
    target = Target(torch.device("cpu"), True, kernel=None, no_kernel="no compiler")
    chosen = machine_plan(target)
    assert chosen.operations.keep_mask is scaled_keep_mask
    assert chosen.operations.loss_sweep is smoothed_loss_sweep
    assert chosen.operations.attention is written_out_attention
    assert chosen.operations.dense_relu is dense_relu
    assert chosen.operations.dropout_add is None
    lines = chosen.describe()
    assert any(
        line.startswith("keep_mask: core's reference") and "no compiler" in line for line in lines
    )
    # PyTorch's fused kernel is passed over for training on a CPU, with its reason
    assert any("its backward pass is the slower on a CPU" in line for line in lines)


def test_the_probe_and_the_ranks_never_build_the_module_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`train()` builds it once; where that failed, the ones after it take the reference
    at once instead of spending another failed build each."""

    def build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(cpu_kernels_module, "is_built", lambda: False)
    monkeypatch.setattr(cpu_kernels_module, "prepare_kernel", build)
    assert training_kernel(build=False) == (None, "the compiled module is not built")


@pytest.mark.parametrize("spend", [False, True])
@pytest.mark.parametrize("vocab", [37, 1000])  # a partial 16-lane tail; many full ones
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_matches_autograd_across_chunk_boundaries(
    loss_sweep: LossSweep, dtype: torch.dtype, vocab: int, spend: bool
) -> None:
    """The loss and its gradient against autograd's; with `spend_logits`, the same, the
    gradient written over the logits (a temporary here, as the model's are)."""
    torch.manual_seed(0)
    rows = 150  # two full chunks of 64 and a partial one
    logits = (torch.randn(rows, vocab) * 3).to(dtype).requires_grad_(True)
    target = torch.randint(1, vocab, (rows,))
    target[::7] = 0  # padding
    target[1] = vocab - 1  # the last word: the target's correction at the row's end
    given = logits * 1.0 if spend else logits
    loss, nll = label_smoothed_sums(given, target, 0.1, 0, loss_sweep, spend_logits=spend)
    (loss * 0.5).backward()
    if spend:  # the logits' memory holds their gradient, scaled by the backward pass
        assert logits.grad is not None and torch.equal(given.detach(), logits.grad)
    ref_logits = logits.detach().float().requires_grad_(True)
    logp = ref_logits.log_softmax(-1)
    mask = (target != 0).float()
    ref_nll = -logp.gather(-1, target[:, None]).squeeze(-1) * mask
    ref = ((0.9 * ref_nll + 0.1 * -logp.mean(-1) * mask).sum()) * 0.5
    ref.backward()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(loss * 0.5, ref.detach(), **tol)
    torch.testing.assert_close(nll, ref_nll.sum().detach(), **tol)
    assert logits.grad is not None and logits.grad.dtype == dtype
    torch.testing.assert_close(logits.grad.float(), ref_logits.grad, **tol)
    assert logits.grad[::7].abs().max().item() == 0.0


U32 = 2.0**-24  # float32's unit roundoff: one rounding moves a value by at most this, relatively


def gamma(k: int) -> float:
    """The bound on the relative error of a sum of k + 1 terms of one sign, in any order
    (Higham, Accuracy and Stability of Numerical Algorithms, section 4.2): k * u / (1 - k * u)."""
    return k * U32 / (1 - k * U32)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of bf16 (8 significant bits) at |x|, in float64."""
    exponent = torch.floor(torch.log2(x.abs().clamp(min=2.0**-126)))
    return torch.pow(2.0, exponent - 7)


@pytest.mark.parametrize("level", ["native", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_sweep_is_the_references_to_rounding(
    kernel_at: Callable[[str], ModuleType], dtype: torch.dtype, level: str
) -> None:
    """Row by row the same figures as core's sweep, within what the arithmetic allows,
    at this CPU's level, at AVX2's and on the plain loops; weights scale each
    row's gradient (0 for padding) and the threads change nothing.

    Both sides compute, in float32, e = exp(x - max) (the module's polynomial: at most 2
    ulp = 4u; PyTorch's and libm's: 1 ulp), the row's sum S of V positive terms (in its
    own order: relative error at most gamma(V - 1)), then w / S, e * (w / S) and the
    subtraction of w * eps / V (one rounding each). So each side's w * p is within
    gamma(V - 1) + 7u of the exact value, relatively, and w * eps / V within 2u; the two
    sides differ by at most twice those, plus the last rounding of each result. bf16
    gradients are rounded from those float32 values: where they fall on either side of
    a rounding boundary they differ by one bf16 ulp more."""
    kernel = kernel_at(level)
    torch.manual_seed(1)
    rows, vocab = 70, 517
    logits = (torch.randn(rows, vocab) * 4).to(dtype)
    target = torch.randint(0, vocab, (rows,))
    weight = torch.rand(rows)
    weight[::5] = 0.0
    compiled = compiled_loss_sweep(kernel)
    lse, mean, ref, grad = compiled(logits, target, weight, 0.1, True)
    r_lse, r_mean, r_ref, r_grad = smoothed_loss_sweep(logits, target, weight, 0.1, True)
    x = logits.double()
    exact_p = torch.softmax(x, -1)
    each_side = gamma(vocab - 1) + 7 * U32
    # lse = max + log S: S's relative error is an absolute one on log S (0 < log S <= log V),
    # then the roundings of the logarithm and of the sum.
    lse_bound = 2 * (each_side + U32 * (math.log(vocab) + r_lse.double().abs() + 1))
    assert ((lse.double() - r_lse.double()).abs() <= lse_bound).all()
    # mean = (sum of V values of either sign) / V: gamma(V - 1) of the sum of their sizes.
    mean_bound = 2 * (gamma(vocab - 1) * x.abs().mean(-1) + U32 * r_mean.double().abs())
    assert ((mean.double() - r_mean.double()).abs() <= mean_bound).all()
    assert torch.equal(ref, r_ref) and ref.dtype == torch.float32
    assert grad is not None and r_grad is not None and grad.dtype == dtype
    w = weight.double()[:, None]
    gap = (grad.double() - r_grad.double()).abs()
    offset = w * 0.1 / vocab  # w * eps / V: two roundings on each side
    bound = 2 * each_side * w * exact_p + 4 * U32 * offset
    bound = bound + U32 * (grad.double().abs() + r_grad.double().abs())  # the subtraction
    if dtype == torch.bfloat16:
        bound = bound + bf16_ulp(r_grad.double())
    assert (gap <= bound).all(), (gap - bound).max().item()
    assert bool((grad[::5] == 0).all())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compiled(logits, target, weight, 0.1, True)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, (lse, mean, ref, grad), strict=True))
    no_grad = compiled(logits, target, weight, 0.1, False)
    assert no_grad[3] is None and torch.equal(no_grad[0], lse)
    spent = logits.clone()  # in place: the same figures, the gradient in the logits' memory
    in_place = compiled(spent, target, weight, 0.1, True, True)
    assert in_place[3] is not None and in_place[3].data_ptr() == spent.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(in_place, (lse, mean, ref, grad), strict=True))


def test_the_compiled_sweep_refuses_a_target_outside_the_vocabulary(kernel: ModuleType) -> None:
    logits = torch.zeros(3, 10)
    with pytest.raises(RuntimeError, match="outside the vocabulary of 10"):
        compiled_loss_sweep(kernel)(logits, torch.tensor([1, 10, 2]), torch.ones(3), 0.1, True)


def test_the_compiled_sweep_leaves_half_precision_to_the_reference(kernel: ModuleType) -> None:
    logits = torch.randn(4, 9).half()
    target, weight = torch.tensor([1, 2, 3, 0]), torch.ones(4)
    got = compiled_loss_sweep(kernel)(logits, target, weight, 0.1, True)
    want = smoothed_loss_sweep(logits, target, weight, 0.1, True)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True) if a is not None)


@pytest.fixture(params=["reference", "compiled", "compiled-avx2", "compiled-generic"])
def attention(request: pytest.FixtureRequest) -> Attention:
    """Each attention a CPU run can train with: core's, and the CPU backend's compiled one
    at this CPU's level, at AVX2's (eight lanes) and at the plain loops every CPU runs."""
    if request.param == "reference":
        return written_out_attention
    return compiled_attention(_capped(request))


def attention_inputs(
    b: int, h: int, length: int, keys: int, d: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Heads as the model makes them (strided views of one projection's output) and a
    padding mask with at least one real key per sentence."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, h * d, generator=gen).to(dtype)
    kv = torch.randn(b, keys, 2 * h * d, generator=gen).to(dtype)
    q = x.view(b, length, h, d).transpose(1, 2)
    k, v = (t.reshape(b, keys, h, d).transpose(1, 2) for t in kv.split(h * d, -1))
    lengths = torch.randint(1, keys + 1, (b,), generator=gen)
    mask = (torch.arange(keys) < lengths[:, None])[:, None, None, :]
    return q, k, v, mask


def float64_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Context and (dq, dk, dv) of sum(context * weights) in float64, the yardstick."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = written_out_attention(*leaves, mask, causal)
    (out * out_weights(out)).sum().backward()
    return out.detach(), tuple(t.grad for t in leaves)  # type: ignore[misc]


def out_weights(out: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(out.shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize(
    ("length", "keys", "d", "causal", "masked"),
    [
        (17, 17, 64, True, False),
        (13, 21, 64, False, True),
        (5, 33, 24, False, True),
        (40, 40, 16, True, False),
        (3, 7, 8, False, False),
        (9, 9, 20, True, True),
        (4, 9, 8, True, True),  # more keys than queries: query i sees keys up to i + 5
    ],
)
def test_attention_and_its_gradients_match_float64(
    attention: Attention, length: int, keys: int, d: int, causal: bool, masked: bool
) -> None:
    """Both attentions against the same sums in float64: float32 to 1e-5 of the largest
    value, and the compiled one no further from float64 than the reference is."""
    q, k, v, mask = attention_inputs(3, 2, length, keys, d, torch.float32)
    mask = mask if masked else None
    want, grads = float64_attention(q, k, v, mask, causal)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, mask, causal)
    assert out.shape == want.shape and out.dtype == torch.float32
    (out.double() * out_weights(out)).sum().backward()
    for got, expected in zip((out, *(t.grad for t in leaves)), (want, *grads), strict=True):
        assert got is not None
        scale = expected.abs().max().item()
        assert (got.double() - expected).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("causal", "masked"), [(True, False), (False, True)])
def test_biased_attention_adds_the_biases_and_sums_their_gradient(
    relu_kernel: ModuleType, dtype: torch.dtype, causal: bool, masked: bool
) -> None:
    """The compiled BiasedAttention (at this CPU's level, AVX2's and the plain loops)
    against the reference's sums in float64 on the same operands: attention of q + b_q,
    k + b_k and v + b_v, and the gradients of q, k, v and the biases. float32 results to
    1e-5 of the largest value; bf16 ones (rounded once, to 2^-8 relative) to 2^-7 of it.
    The bias's gradient is summed in float32 before anything is rounded to bf16."""
    b, h, length, keys, d = 3, 2, 9, 9 if causal else 13, 16
    q, k, v, mask = attention_inputs(b, h, length, keys, d, dtype, seed=3)
    mask = mask if masked else None
    bias = torch.randn(3 * h * d, generator=torch.Generator().manual_seed(4))
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
    want = biased_attention(*leaves64[:3], leaves64[3], mask, causal)
    (want * out_weights(want)).sum().backward()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    got = compiled_biased_attention(relu_kernel)(*leaves[:3], leaves[3], mask, causal)
    assert got.dtype == dtype
    (got.double() * out_weights(got)).sum().backward()
    tolerance = 1e-5 if dtype == torch.float32 else 2.0**-7
    pairs = [(got, want)] + [(a.grad, e.grad) for a, e in zip(leaves, leaves64, strict=True)]
    for a, e in pairs:
        assert a is not None and e is not None
        scale = e.abs().max().item()
        assert (a.double() - e.detach()).abs().max().item() <= tolerance * scale
    assert leaves[3].grad is not None and leaves[3].grad.dtype == torch.float32


def test_compiled_bf16_attention_is_nearer_float64_than_the_reference(kernel: ModuleType) -> None:
    """In bf16 the reference rounds its scores and weights to bf16; the compiled kernel
    keeps them in float32 and rounds only its outputs."""
    compiled = compiled_attention(kernel)
    q, k, v, mask = attention_inputs(4, 4, 15, 19, 64, torch.bfloat16)
    want, grads = float64_attention(q, k, v, mask, False)
    errors = []
    for attend in (written_out_attention, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves, mask, False)
        assert out.dtype == torch.bfloat16
        (out.double() * out_weights(out)).sum().backward()
        got = [out, *(t.grad for t in leaves)]
        errors.append(
            [(g.double() - w).abs().max().item() for g, w in zip(got, (want, *grads), strict=True)]  # type: ignore[union-attr]
        )
    reference, ours = errors
    assert all(o <= r for o, r in zip(ours, reference, strict=True))


@pytest.mark.parametrize("level", ["native", "avx2"])
def test_the_plain_loops_compute_what_the_vector_ones_do(
    kernel_at: Callable[[str], ModuleType], level: str
) -> None:
    """Machines without AVX2 take the plain loops: the same sums to rounding as the
    vector loops of this CPU's level and of AVX2's (eight lanes, a tail of three)."""
    kernel = kernel_at(level)
    q, k, v, mask = attention_inputs(3, 2, 11, 11, 24, torch.float32)
    keys = mask.reshape(3, 11)
    scale = 1 / math.sqrt(24)
    biases = torch.randn(3, 2, 24)
    for causal, bias in itertools.product((False, True), (None, biases)):
        vector = kernel.attention_train_forward(q, k, v, keys, causal, scale, True, True, bias)
        plain = kernel.attention_train_forward(q, k, v, keys, causal, scale, True, False, bias)
        torch.testing.assert_close(plain[0], vector[0], rtol=1e-5, atol=1e-6)
        grad = torch.randn(q.shape)
        back = [
            kernel.attention_train_backward(grad, q, k, v, vector[1], scale, causal, simd, bias)
            for simd in (True, False)
        ]
        assert (back[0][3] is None) == (back[1][3] is None) == (bias is None)
        for a, b in zip(*back, strict=True):
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_compiled_attention_merges_heads_for_free_and_is_thread_independent(
    kernel: ModuleType,
) -> None:
    compiled = compiled_attention(kernel)
    q, k, v, mask = attention_inputs(5, 4, 9, 12, 16, torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(compiled(q, k, v, mask, False))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
    merged = outs[0].transpose(1, 2)  # (B, L, h, d): the layout the output projection reads
    assert merged.is_contiguous()


def test_compiled_attention_leaves_other_masks_and_dtypes_to_the_reference(
    kernel: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counted(*args: object) -> torch.Tensor:
        calls.append("reference")
        return written_out_attention(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_kernels_module, "attention", counted)
    compiled = compiled_attention(kernel)
    q, k, v, _ = attention_inputs(2, 2, 6, 6, 8, torch.float32)
    band = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()  # a per-query mask
    compiled(q, k, v, band, False)
    compiled(q.half(), k.half(), v.half(), None, True)
    assert calls == ["reference", "reference"]
    compiled(q, k, v, None, True, 0.1)  # attention dropout
    assert calls == ["reference"] * 3
    compiled(q, k, v, None, True)
    assert calls == ["reference"] * 3


def training_gradients(operations: Operations, dropout: float = 0.0) -> list[torch.Tensor]:
    """The gradients of one training step of a small model built with `operations`, from
    the same seed (the same weights, and the same masks drawn in the same order)."""
    settings = dict(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2)
    cfg = ModelConfig(**settings, src_vocab_size=30, tgt_vocab_size=30, dropout=dropout)  # type: ignore[arg-type]
    src = torch.tensor([[5, 6, 7, 2, 0], [8, 9, 2, 0, 0]])
    tgt = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    torch.manual_seed(0)
    model = Transformer(cfg, operations).train()
    model(src, tgt).float().square().mean().backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same_training(reference: Operations, planned: Operations, dropout: float = 0.0) -> None:
    """A training step with the planned operations gives the reference's gradients, to
    float32 rounding of sums taken in another order."""
    want, got = training_gradients(reference, dropout), training_gradients(planned, dropout)
    assert len(want) == len(got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_model_trains_through_the_compiled_attention(kernel: ModuleType) -> None:
    """The planned attention reaches every layer, and a training step's gradients agree
    with the reference's."""
    compiled = compiled_attention(kernel)
    cfg = ModelConfig(d_model=32, n_heads=4, src_vocab_size=30, tgt_vocab_size=30)
    model = Transformer(cfg, Operations(attention=compiled))
    assert all(m.ops.attention is compiled for m in model.modules() if hasattr(m, "ops"))
    assert_same_training(
        Operations(attention=written_out_attention), Operations(attention=compiled)
    )


def test_a_model_trains_through_the_biased_attention_and_the_fused_add(
    kernel: ModuleType,
) -> None:
    """With the biased attention, the fused add and the feed-forward's layer planned, no
    linear layer's product adds its bias (PyTorch's addmm): each bias is added by what
    reads the product. A training step's gradients (the biases' included) agree with the
    reference's."""
    keep = compiled_keep_mask(kernel)
    planned = Operations(
        dense_relu=compiled_dense_relu(kernel),
        attention=compiled_attention(kernel),
        biased_attention=compiled_biased_attention(kernel),
        keep_mask=keep,
        dropout_add=compiled_dropout_add(kernel),
    )
    assert_same_training(Operations(keep_mask=keep), planned, dropout=0.3)
    cfg = ModelConfig(d_model=32, n_heads=4, src_vocab_size=30, tgt_vocab_size=30, dropout=0.1)
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 5, 6, 7]])
    for operations, products_with_bias in ((Operations(keep_mask=keep), True), (planned, False)):
        model = Transformer(cfg, operations).train()
        with torch.profiler.profile() as prof:
            model(src, tgt).float().sum().backward()
        names = [e.key for e in prof.key_averages()]
        assert ("aten::addmm" in names) == products_with_bias


def test_compiled_attention_hands_the_projections_their_gradients_whole(
    kernel: ModuleType,
) -> None:
    """Self-attention's q, k and v are heads of one projection's output, cross-attention's
    k and v of another's: the compiled attention writes each output's gradient in one
    piece (no concatenation after autograd's split), and the gradients are the
    reference's."""
    gen = torch.Generator().manual_seed(0)
    b, length, keys, h, d = 3, 6, 8, 2, 8
    x = torch.randn(b, length, 16, generator=gen)
    memory = torch.randn(b, keys, 16, generator=gen)
    mask = torch.ones(b, 1, 1, keys, dtype=torch.bool)
    mask[0, ..., -3:] = False

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, t.size(1), h, d).transpose(1, 2)

    def run(attend: Attention, cross: bool) -> tuple[list[torch.Tensor], list[str]]:
        torch.manual_seed(1)
        w_q, w_kv = torch.nn.Linear(16, h * d), torch.nn.Linear(16, 2 * h * d)
        w_qkv = torch.nn.Linear(16, 3 * h * d)
        with torch.profiler.profile() as prof:
            if cross:
                q = heads(w_q(x))
                k, v = (heads(t) for t in w_kv(memory).split(h * d, -1))
                out = attend(q, k, v, mask, False)
            else:
                q, k, v = (heads(t) for t in w_qkv(x).split(h * d, -1))
                out = attend(q, k, v, None, True)
            (out * out_weights(out).float()).sum().backward()
        layers = (w_q, w_kv) if cross else (w_qkv,)
        grads = [g for layer in layers for g in (layer.weight.grad, layer.bias.grad)]
        return [out.detach(), *grads], [e.key for e in prof.key_averages()]  # type: ignore[misc]

    for cross in (False, True):
        want, _ = run(written_out_attention, cross)
        got, ops = run(compiled_attention(kernel), cross)
        assert "aten::cat" not in ops
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["compiled", "compiled-avx2", "compiled-generic"])
def relu_kernel(request: pytest.FixtureRequest) -> ModuleType:
    """The module at this CPU's level, at AVX2's and at the plain loops."""
    return _capped(request)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 8), (300, 37), (513, 1024)])
def test_the_bias_and_relu_pass_is_one_float32_addition_and_rounding(
    relu_kernel: ModuleType, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    """Forward: y + b in float32, ReLU, rounded once to y's dtype, bit for bit (NaN stays
    NaN). Backward: the gradient where y > 0, bit for bit, and its column sums to float32
    summation's bound (n * 2^-24 * sum |g|, n the rows)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(shape, generator=gen).to(dtype)
    y[0, 0] = float("nan")
    bias = torch.randn(shape[1], generator=gen)
    want = torch.relu(y.float() + bias)
    want[0, 0] = float("nan")
    got = y.clone()
    relu_kernel.bias_relu_(got, bias)
    assert torch.equal(got.isnan(), want.to(dtype).isnan())
    assert torch.equal(got.nan_to_num(), want.to(dtype).nan_to_num())
    grad = torch.randn(shape, generator=gen).to(dtype)
    masked, sums = relu_kernel.relu_bias_backward(grad, got, False)
    assert masked.dtype == dtype and sums.dtype == torch.float32
    assert torch.equal(masked, torch.where(got > 0, grad, torch.zeros_like(grad)))
    exact = masked.double().sum(0)
    bound = shape[0] * 2.0**-24 * masked.double().abs().sum(0)
    assert bool(((sums.double() - exact).abs() <= bound).all())
    spent = grad.clone()  # in place: the same figures, written over the gradient
    over, same_sums = relu_kernel.relu_bias_backward(spent, got, True)
    assert over.data_ptr() == spent.data_ptr()
    assert torch.equal(over, masked) and torch.equal(same_sums, sums)


def at_one_and_two_threads(run: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    """What run() returns with one thread and with two."""
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(run())
    finally:
        torch.set_num_threads(threads)
    return results


def test_the_bias_sums_do_not_depend_on_the_threads(kernel: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    grad, y = torch.randn(1000, 64, generator=gen), torch.randn(1000, 64, generator=gen)
    sums = at_one_and_two_threads(lambda: kernel.relu_bias_backward(grad, y, False)[1])
    assert torch.equal(sums[0], sums[1])


@pytest.mark.parametrize("autocast", [False, True])
def test_the_compiled_feed_forward_layer_is_the_references(
    kernel: ModuleType, autocast: bool
) -> None:
    """max(0, x W^T + b) and its three gradients against the linear layer and ReLU, in
    float32 and under bf16 autocast, where the product is rounded to bf16 before the bias
    is added (one rounding more than the reference's): each output within 2^-7 (|x W^T|
    + |reference|), which covers both roundings; the gradients in autocast's dtype cast
    to the parameters'."""
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 9, 32, generator=gen)
    layer = torch.nn.Linear(32, 48)
    grad = torch.randn(4, 9, 48, generator=gen)
    results = []
    for fn in (dense_relu, compiled_dense_relu(kernel)):
        x = x0.clone().requires_grad_()
        layer.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = fn(x, layer.weight, layer.bias)
        out.backward(grad.to(out.dtype))
        assert layer.weight.grad is not None and layer.bias.grad is not None
        assert layer.weight.grad.dtype == layer.bias.grad.dtype == torch.float32
        results.append((out, x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()))
    (want, *want_grads), (got, *got_grads) = results
    assert got.dtype == want.dtype == (torch.bfloat16 if autocast else torch.float32)
    if not autocast:
        torch.testing.assert_close(got, want)
        for a, e in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, e)
        return
    product = (x0 @ layer.weight.t()).abs()
    bound = 2.0**-7 * (product + want.float().abs())
    assert bool(((got.float() - want.float()).abs() <= bound).all())


def test_the_compiled_feed_forward_layer_leaves_the_rest_to_the_reference(
    kernel: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counted(*args: torch.Tensor) -> torch.Tensor:
        calls.append("reference")
        return dense_relu(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_kernels_module, "dense_relu", counted)
    layer = compiled_dense_relu(kernel)
    x, weight = torch.randn(3, 8), torch.randn(5, 8)
    layer(x, weight, None)  # no bias
    layer(x.half(), weight.half(), torch.zeros(5, dtype=torch.half))
    assert calls == ["reference", "reference"]
    layer(x, weight, torch.zeros(5))
    assert calls == ["reference", "reference"]


def test_a_model_trains_through_the_compiled_feed_forward_layer(kernel: ModuleType) -> None:
    """The planned layer reaches every feed-forward, and a training step's gradients agree
    with the reference's."""
    layer = compiled_dense_relu(kernel)
    cfg = ModelConfig(d_model=32, n_heads=4, src_vocab_size=30, tgt_vocab_size=30)
    model = Transformer(cfg, Operations(dense_relu=layer))
    ffns = [m for m in model.modules() if hasattr(m, "dense_relu")]
    assert len(ffns) == cfg.encoder_layers + cfg.decoder_layers
    assert all(m.dense_relu is layer for m in ffns)
    assert_same_training(Operations(), Operations(dense_relu=layer))


DTYPE_PAIRS = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.bfloat16),  # a float32 residual stream, a bf16 sublayer (autocast)
    (torch.bfloat16, torch.float32),
]


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize(("residual_dtype", "x_dtype"), DTYPE_PAIRS)
def test_the_fused_dropout_add_draws_the_stored_masks_and_keeps_none(
    relu_kernel: ModuleType, residual_dtype: torch.dtype, x_dtype: torch.dtype, biased: bool
) -> None:
    """From the same generator state, residual + dropout(x [+ bias]) drops exactly what the
    module's stored mask drops and scales the rest by its value, without keeping a mask.
    PyTorch's float32 addcmul may fuse x * mask into its addition (an FMA, depending on the
    kernels ATen runs), where the module rounds the product first: float32 sums agree
    within that one rounding, 2^-24 |x * mask|, plus each sum's own, 2^-24 |sum| (bounded
    here by twice both); every other result, and the residual's and x's gradients, bit
    for bit. The bias's gradient, a float32 sum over the rows in another order than
    autograd's, within both sums' rounding: 2 (rows - 1) 2^-24 sum |grad * mask|."""
    gen = torch.Generator().manual_seed(0)
    shape = (37, 111) if biased else (4099,)  # whole vectors and a tail at every width
    residual = torch.randn(shape, generator=gen).to(residual_dtype).requires_grad_()
    x = torch.randn(shape, generator=gen).to(x_dtype).requires_grad_()
    bias = torch.randn(shape[-1], generator=gen).requires_grad_() if biased else None
    grad = torch.randn(shape, generator=gen)
    results, kept = [], []
    for add in (
        lambda r, v: masked_dropout_add(r, v, 0.3, compiled_keep_mask(relu_kernel), bias),
        lambda r, v: compiled_dropout_add(relu_kernel)(r, v, 0.3, bias),
    ):
        torch.manual_seed(7)
        out = add(residual, x)
        assert out.grad_fn is not None
        kept.append(len(out.grad_fn.saved_tensors))  # type: ignore[attr-defined]
        out.backward(grad.to(out.dtype))
        results.append((out.detach(), residual.grad, x.grad, None if bias is None else bias.grad))
        residual.grad = x.grad = None
        if bias is not None:
            bias.grad = None
    (want, *want_grads, want_bias), (got, *got_grads, got_bias) = results
    assert got.dtype == want.dtype
    assert kept == [1, 0]  # the stored mask; nothing
    for a, e in zip(got_grads, want_grads, strict=True):
        assert torch.equal(a, e)
    biased_x = x.detach().float() + (0 if bias is None else bias.detach())
    if (
        got.dtype == torch.float32
        and (biased or x_dtype == torch.float32)
        and (residual_dtype == torch.float32)
    ):
        product = biased_x.abs() / (1 - 0.3)
        bound = 2.0**-23 * (product + want.abs())
        assert bool(((got - want).abs() <= bound).all())
    else:
        assert torch.equal(got, want)
    if bias is not None:
        assert got_bias is not None and want_bias is not None and got_bias.dtype == torch.float32
        terms = (grad / (1 - 0.3)).abs().sum(0)  # at most |grad * mask| summed
        bound = 2 * (shape[0] - 1) * 2.0**-24 * terms
        assert bool(((got_bias - want_bias).abs() <= bound).all())


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize(("residual_dtype", "x_dtype"), DTYPE_PAIRS)
def test_the_fused_dropout_adds_vector_loops_are_the_plain_loops_bit_for_bit(
    kernel_at: Callable[[str], ModuleType],
    level: str,
    residual_dtype: torch.dtype,
    x_dtype: torch.dtype,
) -> None:
    plain, vector = kernel_at("generic"), kernel_at(level)
    gen = torch.Generator().manual_seed(1)
    for n, p in ((1, 0.1), (37, 0.5), (5000, 0.1), (1031, 0.99999)):
        residual = torch.randn(n, generator=gen).to(residual_dtype)
        x = torch.randn(n, generator=gen).to(x_dtype)
        outs = [k.dropout_add(residual, x, p, 2**40 + n, None) for k in (plain, vector)]
        assert torch.equal(outs[0], outs[1]), (n, p)
        grads = [k.dropout_grad(outs[0], p, 2**40 + n, x_dtype) for k in (plain, vector)]
        assert torch.equal(grads[0], grads[1]), (n, p)
        # With a bias over rows of 1, 7, 8 and 40 (runs across tiles and vectors).
        for columns in (c for c in (1, 7, 8, 40) if n % c == 0):
            bias = torch.randn(columns, generator=gen)
            rows = [residual.view(-1, columns), x.view(-1, columns)]
            biased = [k.dropout_add(*rows, p, 2**40 + n, bias) for k in (plain, vector)]
            assert torch.equal(biased[0], biased[1]), (n, p, columns)
            summed = [
                k.dropout_grad_summed(biased[0], p, 2**40 + n, x_dtype, columns)
                for k in (plain, vector)
            ]
            assert torch.equal(summed[0][0], summed[1][0]), (n, p, columns)
            assert torch.equal(summed[0][1], summed[1][1]), (n, p, columns)


def test_the_fused_dropout_add_does_not_depend_on_the_threads(kernel: ModuleType) -> None:
    gen = torch.Generator().manual_seed(2)
    residual, x = torch.randn(300, 1000, generator=gen), torch.randn(300, 1000, generator=gen)
    outs = at_one_and_two_threads(lambda: kernel.dropout_add(residual, x, 0.1, 12345, None))
    assert torch.equal(outs[0], outs[1])
    bias = torch.randn(1000, generator=gen)
    biased = at_one_and_two_threads(lambda: kernel.dropout_add(residual, x, 0.1, 12345, bias))
    assert torch.equal(biased[0], biased[1])
    grads = at_one_and_two_threads(
        lambda: torch.cat(
            [t.flatten() for t in kernel.dropout_grad_summed(residual, 0.1, 9, torch.float32, 1000)]
        )
    )
    assert torch.equal(grads[0], grads[1])  # the bias's sums too


def test_a_model_trains_through_the_fused_dropout_add(kernel: ModuleType) -> None:
    """With dropout on, the fused add draws the masks the stored ones would, in the same
    order: a training step's gradients are the stored masks' to rounding."""
    keep, fused = compiled_keep_mask(kernel), compiled_dropout_add(kernel)
    cfg = ModelConfig(d_model=32, n_heads=4, src_vocab_size=30, tgt_vocab_size=30)
    model = Transformer(cfg, Operations(keep_mask=keep, dropout_add=fused))
    residual_adds = [m for m in model.modules() if isinstance(m, Dropout) and m.fused_add]
    assert len(residual_adds) == cfg.encoder_layers + cfg.decoder_layers  # a layer's
    assert_same_training(
        Operations(keep_mask=keep), Operations(keep_mask=keep, dropout_add=fused), dropout=0.3
    )
