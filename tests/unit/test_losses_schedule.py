"""Label-smoothed cross-entropy against a hand computation; the paper's schedule values."""

from __future__ import annotations

import math

import pytest
import torch

from nmt_cli.core.losses import label_smoothed_sums
from nmt_cli.core.schedule import paper_adam, paper_learning_rate


def test_loss_equals_hand_computation() -> None:
    # Two tokens over a vocabulary of 3; the second target is padding (id 0).
    logits = torch.tensor([[[1.0, 2.0, 0.5], [0.3, 0.1, 0.2]]])
    target = torch.tensor([[1, 0]])
    eps = 0.1
    loss, nll_sum = label_smoothed_sums(logits, target, eps=eps, pad_id=0)
    z = [1.0, 2.0, 0.5]
    lse = math.log(sum(math.exp(v) for v in z))
    logp = [v - lse for v in z]
    nll = -logp[1]
    smooth = -sum(logp) / 3
    assert nll_sum.item() == pytest.approx(nll, rel=1e-6)  # the padding adds nothing
    assert loss.item() == pytest.approx((1 - eps) * nll + eps * smooth, rel=1e-6)


def test_loss_gradient_equals_autograd_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    loss, _ = label_smoothed_sums(logits, target, eps=0.1, pad_id=0)
    loss.backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    logp = ref_logits.log_softmax(-1)
    mask = (target != 0).float()
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    ref = ((0.9 * nll + 0.1 * -logp.mean(-1)) * mask).sum()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-6)
    assert logits.grad is not None and logits.grad[1, 3:].abs().max().item() == 0.0


@pytest.mark.parametrize("said", [True, False])
def test_the_gradient_scales_with_the_incoming_one_once(said: bool) -> None:
    """The trainer multiplies the loss by 1 / its target tokens before the backward pass.
    Said in advance (`grad_scale`), the sweep folds it into the gradient and the backward
    pass hands the gradient on as it is: a second backward through the graph gets the
    same again. Not said, the backward pass scales the kept gradient in place: the same
    gradient, and a second backward is refused (the kept gradient is spent), never given
    a gradient scaled twice."""
    scale = 1 / 3412  # not a float32: compared as the backward pass receives it
    logits = torch.randn(4, 13, generator=torch.Generator().manual_seed(2), requires_grad=True)
    target = torch.tensor([1, 5, 12, 0])
    loss, _ = label_smoothed_sums(logits, target, 0.1, 0, grad_scale=scale if said else 1.0)
    (loss * scale).backward(retain_graph=True)
    assert logits.grad is not None
    once = logits.grad.clone()
    plain = logits.detach().clone().requires_grad_(True)
    label_smoothed_sums(plain, target, eps=0.1, pad_id=0)[0].backward()
    assert plain.grad is not None
    torch.testing.assert_close(once, plain.grad * scale)
    if said:
        (loss * scale).backward()
        torch.testing.assert_close(logits.grad, 2 * once)
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_no_smoothing_is_plain_nll() -> None:
    logits = torch.randn(4, 7)
    target = torch.tensor([1, 2, 3, 4])
    loss, nll = label_smoothed_sums(logits, target, eps=0.0, pad_id=0)
    expected = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert nll.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (1, 512**-0.5 * 4000**-1.5),
        (4000, 512**-0.5 * 4000**-0.5),
        (100_000, 512**-0.5 * 100_000**-0.5),
    ],
)
def test_schedule_values(step: int, expected: float) -> None:
    assert paper_learning_rate(step, d_model=512, warmup=4000) == pytest.approx(expected)


def test_schedule_peaks_at_warmup() -> None:
    lrs = [paper_learning_rate(s, 512, 4000) for s in range(3990, 4011)]
    assert max(lrs) == paper_learning_rate(4000, 512, 4000)
    assert paper_learning_rate(4000, 512, 4000) == pytest.approx(7.0e-4, rel=0.01)


def test_adam_uses_the_paper_settings() -> None:
    opt = paper_adam(torch.nn.Linear(2, 2).parameters())
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
