"""The model's hot operations, each with its native reference, as one object.

The Transformer (core/transformer.py) is written against these operations and never
chooses how they run: a model built with `Operations()` computes every one of them by
its reference in this package, the arithmetic of the paper in PyTorch's operations.
A backend that does one faster (PyTorch's fused attention kernels, the CPU backend's
compiled module) declares it, and the planner (nmt_cli/backends/plan.py) puts the chosen
implementations into one `Operations` for a model, on its device and in its precision,
before the model is built. The model holds that object from its construction; nothing
is set on its modules afterwards.

The linear layers are an operation too, one with weights: `linear` makes each of them
when the model is built (core/step_linear.py), so a planned implementation holds the
weights in its own form from the start. The decoding step's other operations (the
cache's attention, the beam's advance) belong to the object search decodes, a
`core.searchable.Searchable`, which a backend may provide whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from nmt_cli.core.attention import Attention, BiasedAttention, attention, fused_attention
from nmt_cli.core.dropout import DropoutAdd, KeepMask, scaled_keep_mask
from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep
from nmt_cli.core.step_linear import DenseReLU, LinearLayer, dense_relu


@dataclass(frozen=True)
class Operations:
    """What the model calls for each hot operation; the defaults are the references."""

    # Attention over whole sequences: training, encoding, the first decoding step.
    attention: Attention = attention
    # Attention that adds the q, k and v projections' biases itself (core/attention.py);
    # None: the projections add theirs, and `attention` attends.
    biased_attention: BiasedAttention | None = None
    # Attention over the blocks of a restricted window: PyTorch's fused kernel, whose
    # tiles keep the blocks' memory linear in the length (core/local_attention.py).
    blocks: Attention = fused_attention
    # Dropout's masks; None: PyTorch's own dropout (a GPU's fused kernel).
    keep_mask: KeepMask | None = scaled_keep_mask
    # residual + dropout(x) as one operation; None: with keep_mask's masks, kept for the
    # backward pass (core/dropout.py).
    dropout_add: DropoutAdd | None = None
    # The smoothed loss's sweep over the logits (core/losses.py).
    loss_sweep: LossSweep = smoothed_loss_sweep
    # The linear layers, with their fused ReLU and residual add (core/step_linear.py).
    linear: LinearLayer = nn.Linear
    # The feed-forward's first layer and its ReLU over whole sequences, given an
    # `nn.Linear`'s weight and bias (core/step_linear.py).
    dense_relu: DenseReLU = dense_relu


REFERENCE = Operations()
