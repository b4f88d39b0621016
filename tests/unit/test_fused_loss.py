"""The GPU's loss form, run on the CPU: the output projection fused into the chunked
label-smoothed loss gives the unfused loss and its gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.core.losses import label_smoothed_sums, projected_label_smoothed_sums

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _problem(rows: int, vocab: int, dim: int, pad: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(rows + vocab)
    hidden = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(vocab, dim, generator=gen) * 0.3
    target = torch.randint(1, vocab, (rows,), generator=gen)
    if pad:
        target[::5] = 0
    return hidden, weight, target


def _run(
    fused: bool,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bf16: bool,
    chunk_rows: int | None = None,
    tokens: int | None = None,
) -> Result:
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if fused:
            loss, nll = projected_label_smoothed_sums(h, w, target, 0.1, 0, tokens, chunk_rows)
        else:
            loss, nll = label_smoothed_sums(F.linear(h, w), target, 0.1, 0)
    loss.backward()
    assert h.grad is not None and w.grad is not None
    return loss.detach(), nll, h.grad, w.grad


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_one_chunk_is_bit_for_bit_the_unfused_loss_and_gradients(bf16: bool, pad: bool) -> None:
    """Same products, same sweep, same order of sums: identical, not merely close."""
    hidden, weight, target = _problem(48, 300, 32, pad)
    tokens = int((target != 0).sum())
    unfused = _run(False, hidden, weight, target, bf16)
    fused = _run(True, hidden, weight, target, bf16, chunk_rows=64, tokens=tokens)
    names = ("loss", "nll", "hidden grad", "weight grad")
    for name, a, b in zip(names, unfused, fused, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("bf16", [False, True])
def test_many_chunks_equal_loss_and_hidden_gradient_and_close_weight_gradient(bf16: bool) -> None:
    """Across chunks the loss and the hidden states' gradient stay identical (per-row
    arithmetic); the embedding's gradient is a sum of per-chunk products, so only its
    rounding differs, at the precision's own level."""
    hidden, weight, target = _problem(300, 1000, 64, pad=True)
    unfused = _run(False, hidden, weight, target, bf16)
    fused = _run(True, hidden, weight, target, bf16, chunk_rows=64)  # tokens counted
    for a, b in zip(unfused[:3], fused[:3], strict=True):
        assert torch.equal(a, b)
    tol = {"rtol": 1e-5, "atol": 1e-5} if not bf16 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(fused[3], unfused[3], **tol)
    assert fused[2][::5].abs().max().item() == 0.0  # padding rows get no gradient


def test_gradient_scales_with_the_incoming_gradient_and_needs_no_grad_in_validation() -> None:
    hidden, weight, target = _problem(40, 50, 16, pad=True)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss, _ = projected_label_smoothed_sums(h, w, target, 0.1, 0)
    (loss * 0.25).backward()
    plain = _run(True, hidden, weight, target, bf16=False)
    assert h.grad is not None and w.grad is not None
    torch.testing.assert_close(h.grad, plain[2] * 0.25)
    torch.testing.assert_close(w.grad, plain[3] * 0.25)
    with torch.no_grad():
        again, nll = projected_label_smoothed_sums(hidden, weight, target, 0.1, 0)
    assert torch.equal(again, loss.detach()) and torch.equal(nll, plain[1])


def test_batch_without_real_tokens_gives_zero_loss_and_gradient() -> None:
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    target = torch.zeros(2, 3, dtype=torch.long)
    loss, nll = projected_label_smoothed_sums(hidden, weight, target, 0.1, 0, tokens=0)
    loss.backward()
    assert loss.item() == 0.0 and nll.item() == 0.0
    assert hidden.grad is not None and hidden.grad.abs().max().item() == 0.0
    assert weight.grad is not None and weight.grad.abs().max().item() == 0.0
