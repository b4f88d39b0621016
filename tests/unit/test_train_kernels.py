"""The training fast paths: the cheaper CPU dropout (core's mask, the reference, and the
CPU backend's compiled one, held to the same tests) and the loss's sweep over the logits
(core's chunked one, the reference, and the compiled one, held to autograd's loss)."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch

from nmt_cli.core.dropout import Dropout, KeepMask, scaled_keep_mask
from nmt_cli.core.losses import LossSweep, label_smoothed_sums, smoothed_loss_sweep
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.transformer import Transformer
from nmt_cli.engines.train import cpu_kernels as cpu_kernels_module
from nmt_cli.engines.train.cpu_kernels import (
    CpuKernels,
    compiled_keep_mask,
    compiled_loss_sweep,
    cpu_kernels,
)


@pytest.fixture(params=["reference", "compiled"])
def keep_mask(request: pytest.FixtureRequest) -> KeepMask:
    """Each mask a CPU run can draw from: core's, and the CPU backend's compiled one."""
    if request.param == "reference":
        return scaled_keep_mask
    return compiled_keep_mask(request.getfixturevalue("kernel"))


@pytest.fixture(params=["reference", "compiled"])
def loss_sweep(request: pytest.FixtureRequest) -> LossSweep:
    """Each loss sweep a CPU run can use: core's, and the CPU backend's compiled one."""
    if request.param == "reference":
        return smoothed_loss_sweep
    return compiled_loss_sweep(request.getfixturevalue("kernel"))


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


def test_training_on_a_cpu_draws_its_masks_from_the_compiled_module(kernel: ModuleType) -> None:
    kernels, why = cpu_kernels()
    keep = kernels.keep_mask
    assert why is None and keep is not scaled_keep_mask
    assert kernels.loss_sweep is not smoothed_loss_sweep
    settings = dict(d_model=16, d_ff=32, n_heads=2, encoder_layers=1, decoder_layers=1)
    model = Transformer(ModelConfig(**settings, src_vocab_size=20, tgt_vocab_size=20))  # type: ignore[arg-type]
    model.set_dropout_mask(keep)
    drops = [m for m in model.modules() if isinstance(m, Dropout)]
    assert drops and all(m.keep_mask is keep for m in drops)


def test_the_probe_and_the_ranks_never_build_the_module_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`train()` builds it once; where that failed, the ones after it take the reference
    at once instead of spending another failed build each."""

    def build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(cpu_kernels_module, "is_built", lambda: False)
    monkeypatch.setattr(cpu_kernels_module, "prepare_kernel", build)
    kernels, why = cpu_kernels(build=False)
    assert kernels == CpuKernels() and why == "the compiled module is not built"


@pytest.mark.parametrize("vocab", [37, 1000])  # a partial 16-lane tail; many full ones
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_matches_autograd_across_chunk_boundaries(
    loss_sweep: LossSweep, dtype: torch.dtype, vocab: int
) -> None:
    torch.manual_seed(0)
    rows = 150  # two full chunks of 64 and a partial one
    logits = (torch.randn(rows, vocab) * 3).to(dtype).requires_grad_(True)
    target = torch.randint(1, vocab, (rows,))
    target[::7] = 0  # padding
    target[1] = vocab - 1  # the last word: the target's correction at the row's end
    loss, nll = label_smoothed_sums(logits, target, 0.1, 0, loss_sweep)
    (loss * 0.5).backward()
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_sweep_is_the_references_to_rounding(
    kernel: ModuleType, dtype: torch.dtype
) -> None:
    """Row by row the same figures as core's sweep: the exponential differs in the last
    bits, so float32 agrees to 1e-5 and bfloat16 gradients to one unit in the last place;
    weights scale each row's gradient (0 for padding) and the threads change nothing."""
    torch.manual_seed(1)
    rows, vocab = 70, 517
    logits = (torch.randn(rows, vocab) * 4).to(dtype)
    target = torch.randint(0, vocab, (rows,))
    weight = torch.rand(rows)
    weight[::5] = 0.0
    compiled = compiled_loss_sweep(kernel)
    lse, mean, ref, grad = compiled(logits, target, weight, 0.1, True)
    r_lse, r_mean, r_ref, r_grad = smoothed_loss_sweep(logits, target, weight, 0.1, True)
    torch.testing.assert_close(lse, r_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, r_mean, rtol=1e-5, atol=1e-6)
    assert torch.equal(ref, r_ref) and ref.dtype == torch.float32
    assert grad is not None and r_grad is not None and grad.dtype == dtype
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-20  # relative, at most
    gap = (grad.float() - r_grad.float()).abs() - ulp * r_grad.float().abs()
    assert gap.max().item() <= 1e-7  # and below 1e-7 where p - eps / V nearly cancels
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
