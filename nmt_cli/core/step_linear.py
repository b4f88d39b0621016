"""The decoder step's linear layers: a plain `nn.Linear`, or a decode-only stand-in.

A decoder step calls twenty linear layers with a few rows each, and at one sentence a
batch the calling costs about as much as the arithmetic. The step therefore calls them
through these functions, which skip `nn.Module.__call__`'s hook handling, and lets a
stand-in (a `StepLinear`, which a decoding backend swaps in for an `nn.Linear`, e.g.
nmt_cli/backends/cpu's packed bf16 and int8 layers) take the FFN's ReLU and the residual
add into its own product. The plain `nn.Linear` path is the reference arithmetic; the
model never knows which layers it holds.
"""

from __future__ import annotations

from typing import cast

import torch.nn.functional as F
from torch import Tensor, nn


class StepLinear(nn.Module):
    """y = x W^T + b for decoding only, with two fused forms a backend may override."""

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b)."""
        return F.relu(self.forward(x))

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + x W^T + b."""
        return residual + self.forward(x)


def linear(layer: nn.Module, x: Tensor) -> Tensor:
    """`layer(x)` without `nn.Module.__call__`."""
    if isinstance(layer, nn.Linear):
        return F.linear(x, layer.weight, layer.bias)
    return cast(Tensor, layer.forward(x))


def linear_relu(layer: nn.Module, x: Tensor) -> Tensor:
    """max(0, layer(x)), fused into the product by a stand-in that can."""
    if isinstance(layer, StepLinear):
        return layer.relu(x)
    return F.relu(linear(layer, x))


def linear_add(layer: nn.Module, x: Tensor, residual: Tensor) -> Tensor:
    """residual + layer(x), fused into the product by a stand-in that can."""
    if isinstance(layer, StepLinear):
        return layer.add(x, residual)
    return residual + linear(layer, x)
