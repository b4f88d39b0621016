"""The linear layer as an operation: how the model makes its linear layers, and the
reference arithmetic of the decoder step's calls to them.

`Operations.linear` (core/operations.py) makes every linear layer of a Transformer when
it is built, from its input and output widths. The reference is `nn.Linear`: its
parameters are the model's, trained and saved. A decoding backend may plan a decode-only
`StepLinear` instead (e.g. nmt_cli/backends/cpu's packed bf16 and int8 layers), which
holds its weight only in its kernel's form, made once as the checkpoint loads; the model
is built with those layers and never changed afterwards.

A decoder step calls twenty linear layers with a few rows each, and at one sentence a
batch the calling costs about as much as the arithmetic. The step therefore calls them
through the functions below, which skip `nn.Module.__call__`'s hook handling and let a
`StepLinear` take the FFN's ReLU and the residual add into its own product. On an
`nn.Linear` they are the reference: PyTorch's product, then the ReLU or the add.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch.nn.functional as F
from torch import Tensor, nn

LinearLayer = Callable[[int, int], nn.Module]
"""Makes a linear layer from its (in_features, out_features): `nn.Linear`, or a backend's."""


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
