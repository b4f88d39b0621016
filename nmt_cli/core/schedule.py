"""The optimiser and learning-rate schedule of section 5.3.

lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): a linear warm-up for
`warmup` steps, then decay with the inverse square root of the step number.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def paper_learning_rate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Equation (3) of the paper; `step` counts from 1 (step 0 would divide by zero)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def paper_adam(
    params: Iterable[nn.Parameter],
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> torch.optim.Adam:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9); the learning rate is set every step.

    The fused implementation updates all parameters in one kernel where the build has one.
    """
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=0.0, betas=betas, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=0.0, betas=betas, eps=eps)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
