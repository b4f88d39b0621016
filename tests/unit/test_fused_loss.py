"""The GPU's loss form, run on the CPU: the output projection fused into the chunked
label-smoothed loss gives the unfused loss and its gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.core.losses import label_smoothed_sums, projected_label_smoothed_sums

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
SMOOTHING = 0.1


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
            loss, nll = projected_label_smoothed_sums(
                h, w, target, SMOOTHING, 0, tokens, chunk_rows
            )
        else:
            loss, nll = label_smoothed_sums(F.linear(h, w), target, SMOOTHING, 0)
    loss.backward()
    assert h.grad is not None and w.grad is not None
    return loss.detach(), nll, h.grad, w.grad


def _gamma(terms: int) -> float:
    """The bound on the relative rounding error of an fp32 sum of `terms` products
    (Higham's gamma_n, unit roundoff 2^-24)."""
    u = 2.0**-24
    return terms * u / (1 - terms * u)


def _reordering_bounds(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bf16: bool
) -> Result:
    """How far two correct computations of the loss, the nll and both gradients may lie
    apart when the products are summed in another order (a BLAS picks its blocking by the
    number of rows, and the fused path projects only the real rows, a chunk at a time).

    A logit is a D-term sum: two orders differ by at most 2 gamma_D |h||w|, and in bf16 its
    stored value by one more rounding (2^-7 of it). A row's logsumexp, mean and target
    logit each move by at most the row's largest such change m, so its loss and nll by 2m.
    The logits' gradient G = p - q moves by at most 2 p m (p the softmax), plus one
    rounding of G in bf16; the gradients G W and G^T h, V-term and N-term sums, differ by
    their own reordering, what G's change carries through, and in bf16 their rounding."""
    out = 2.0**-7 if bf16 else 0.0
    w = weight.to(torch.bfloat16).float() if bf16 else weight
    h = hidden.to(torch.bfloat16).float() if bf16 else hidden
    real = (target != 0).float()[:, None]
    z = h @ w.t()
    p = torch.softmax(z, dim=-1)
    q = torch.full_like(p, SMOOTHING / p.size(1)).scatter_add_(
        1, target[:, None], torch.full_like(p[:, :1], 1 - SMOOTHING)
    )
    g = (p - q) * real
    m = (2 * _gamma(h.size(1)) * (h.abs() @ w.abs().t()) + out * z.abs()).amax(-1, keepdim=True)
    dg = (2 * p * m + out * g.abs()) * real
    loss = float(2 * (m * real).sum())
    grad_h = (2 * _gamma(w.size(0)) + out) * (g.abs() @ w.abs()) + dg @ w.abs()
    grad_w = (2 * _gamma(h.size(0)) + out) * (g.abs().t() @ h.abs()) + dg.t() @ h.abs()
    return torch.tensor(loss), torch.tensor(loss), grad_h, grad_w


def _within(bounds: Result, got: Result, expected: Result) -> None:
    names = ("loss", "nll", "hidden grad", "weight grad")
    for name, bound, a, b in zip(names, bounds, got, expected, strict=True):
        excess = (a.float() - b.float()).abs() - bound
        assert excess.max().item() <= 0.0, (name, excess.max().item())


@pytest.mark.parametrize("bf16", [False, True])
def test_one_chunk_of_all_rows_is_bit_for_bit_the_unfused_loss_and_gradients(bf16: bool) -> None:
    """No padding, one chunk: the same products on the same shapes, the same sweep, the
    same order of sums: identical, not merely close."""
    hidden, weight, target = _problem(48, 300, 32, pad=False)
    unfused = _run(False, hidden, weight, target, bf16)
    fused = _run(True, hidden, weight, target, bf16, chunk_rows=64, tokens=48)
    names = ("loss", "nll", "hidden grad", "weight grad")
    for name, a, b in zip(names, unfused, fused, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize(("rows", "vocab", "dim"), [(48, 300, 32), (300, 1000, 64)])
def test_padding_skipped_and_chunks_give_the_unfused_loss_up_to_the_order_of_sums(
    bf16: bool, rows: int, vocab: int, dim: int
) -> None:
    """Only the real rows projected, a chunk at a time: the products are the same sums in
    another order (and the embedding's gradient a sum of per-chunk products), so the loss
    and the gradients lie within the reordering bounds of the arithmetic, and padding rows
    get no gradient at all."""
    hidden, weight, target = _problem(rows, vocab, dim, pad=True)
    unfused = _run(False, hidden, weight, target, bf16)
    fused = _run(True, hidden, weight, target, bf16, chunk_rows=64)  # tokens counted
    _within(_reordering_bounds(hidden, weight, target, bf16), fused, unfused)
    assert fused[2][::5].abs().max().item() == 0.0


def test_gradient_scales_with_the_incoming_gradient_and_needs_no_grad_in_validation() -> None:
    hidden, weight, target = _problem(40, 50, 16, pad=True)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss, _ = projected_label_smoothed_sums(h, w, target, SMOOTHING, 0)
    (loss * 0.25).backward()
    plain = _run(True, hidden, weight, target, bf16=False)
    assert h.grad is not None and w.grad is not None
    torch.testing.assert_close(h.grad, plain[2] * 0.25)
    torch.testing.assert_close(w.grad, plain[3] * 0.25)
    with torch.no_grad():
        again, nll = projected_label_smoothed_sums(hidden, weight, target, SMOOTHING, 0)
    assert torch.equal(again, loss.detach()) and torch.equal(nll, plain[1])


def test_batch_without_real_tokens_gives_zero_loss_and_gradient() -> None:
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    target = torch.zeros(2, 3, dtype=torch.long)
    loss, nll = projected_label_smoothed_sums(hidden, weight, target, SMOOTHING, 0, tokens=0)
    loss.backward()
    assert loss.item() == 0.0 and nll.item() == 0.0
    assert hidden.grad is not None and hidden.grad.abs().max().item() == 0.0
    assert weight.grad is not None and weight.grad.abs().max().item() == 0.0
