"""The training fast paths: the cheaper CPU dropout and the chunked loss sweep."""

from __future__ import annotations

import pytest
import torch

from nmt_cli.core.dropout import Dropout
from nmt_cli.core.losses import label_smoothed_sums


def test_dropout_drops_p_and_scales_the_rest() -> None:
    torch.manual_seed(0)
    drop = Dropout(0.1).train()
    x = torch.ones(200, 500, requires_grad=True)
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(0.1, abs=0.005)
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    y.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, y.detach())  # gradient is the same scaled mask


def test_dropout_is_reproducible_from_the_seed_and_off_in_eval() -> None:
    drop = Dropout(0.3).train()
    x = torch.randn(64, 32)
    torch.manual_seed(7)
    a = drop(x)
    torch.manual_seed(7)
    b = drop(x)
    assert torch.equal(a, b)
    assert torch.equal(drop.eval()(x), x)


def test_dropout_add_is_residual_plus_dropout() -> None:
    drop = Dropout(0.2).train()
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
