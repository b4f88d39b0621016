"""The linear layer as an operation: what makes a model's linear layers, and the
reference arithmetic of the decoder step's calls to them.

`Operations.linear` makes each linear layer when the model is built: `nn.Linear`, the
reference, or a backend's decode-only `StepLinear` (nmt_cli/backends/cpu's packed bf16
and int8 layers), which keeps its weight only in its kernel's form, made as the
checkpoint loads. A decoder step calls twenty linear layers with a few rows each, where
calling costs as much as the arithmetic: it calls them through the functions below,
which skip `nn.Module.__call__` and let a `StepLinear` fuse the FFN's ReLU and the
residual add into its product; on an `nn.Linear` they are the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch.nn.functional as F
from torch import Tensor, nn

LinearLayer = Callable[[int, int], nn.Module]
"""Makes a linear layer from its (in_features, out_features): `nn.Linear`, or a backend's."""

DenseReLU = Callable[[Tensor, Tensor, Tensor | None], Tensor]
"""(x, weight, bias) -> max(0, x W^T + b): the feed-forward's first layer over whole
sequences (training, encoding), as `Operations.dense_relu` runs it."""


def dense_relu(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The reference DenseReLU: PyTorch's linear layer, then its ReLU."""
    return F.relu(F.linear(x, weight, bias))


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
