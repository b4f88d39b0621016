"""The training fast paths: the cheaper CPU dropout (core's mask, the reference, and the
CPU backend's compiled one, held to the same tests) and the chunked loss sweep."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch

from nmt_cli.core.dropout import Dropout, KeepMask, scaled_keep_mask
from nmt_cli.core.losses import label_smoothed_sums
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.transformer import Transformer
from nmt_cli.engines.train.dropout_mask import compiled_keep_mask, cpu_keep_mask


@pytest.fixture(params=["reference", "compiled"])
def keep_mask(request: pytest.FixtureRequest) -> KeepMask:
    """Each mask a CPU run can draw from: core's, and the CPU backend's compiled one."""
    if request.param == "reference":
        return scaled_keep_mask
    return compiled_keep_mask(request.getfixturevalue("kernel"))


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
    keep, why = cpu_keep_mask()
    assert why is None and keep is not scaled_keep_mask
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
    from nmt_cli.engines.train import dropout_mask

    def build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(dropout_mask, "is_built", lambda: False)
    monkeypatch.setattr(dropout_mask, "prepare_kernel", build)
    keep, why = cpu_keep_mask(build=False)
    assert keep is scaled_keep_mask and why == "the compiled module is not built"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_matches_autograd_across_chunk_boundaries(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    rows, vocab = 150, 37  # 150 rows: two full chunks of 64 and a partial one
    logits = (torch.randn(rows, vocab) * 3).to(dtype).requires_grad_(True)
    target = torch.randint(1, vocab, (rows,))
    target[::7] = 0  # padding
    loss, nll = label_smoothed_sums(logits, target, 0.1, 0)
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
