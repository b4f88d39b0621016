"""Layer normalisation (section 3.1's "LayerNorm(x + Sublayer(x))") that keeps the
residual stream in the autocast precision on GPUs.

CUDA autocast runs `layer_norm` in fp32: a bf16 residual stream is cast up before every
norm and the fp32 output cast down again by the next linear layer, in the forward and the
backward pass: a noticeable share of a base model's GPU time (BENCHMARKS.md, "GPU"). The
CUDA kernel already accumulates bf16 and fp16 statistics in fp32, so here the norm runs
in the input's own 16-bit dtype (its two d_model-sized parameter vectors cast instead).
On a CPU, autocast leaves `layer_norm` in the input's dtype already, and nothing changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def low_precision_layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """`norm(x)` computed in x's 16-bit dtype, outside autocast's fp32 rule."""
    weight = norm.weight.to(x.dtype) if norm.weight is not None else None
    bias = norm.bias.to(x.dtype) if norm.bias is not None else None
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` whose output stays bf16/fp16 under CUDA autocast."""

    def forward(self, x: Tensor) -> Tensor:
        device = x.device.type
        if device == "cuda" and x.dtype in _LOW_PRECISION and torch.is_autocast_enabled(device):
            return low_precision_layer_norm(self, x)
        return super().forward(x)

    def step(self, x: Tensor) -> Tensor:
        """`forward` for a decoder step, straight to the kernel: the five Python calls
        between `norm(x)` and it cost more than the kernel itself at a few rows, and a
        step makes nine. (Under CUDA autocast the output is fp32, as plain autocast has
        it: decoding models are cast to their dtype and run without autocast.)"""
        return torch.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
