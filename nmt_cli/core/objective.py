"""What training minimises, as one module: the teacher-forced Transformer and the
label-smoothed loss of section 5.4, summed over the batch's real target tokens.

One module because DistributedDataParallel must see every use of a parameter inside the
forward it wraps, and the fused loss uses the tied output projection (section 3.4)
itself. Two forms of the same arithmetic (`core/losses.py`):

- unfused (CPUs): the model returns logits; the loss sweeps them a row or a few rows
  at a time, in the CPU's cache (`loss_sweep`: the core's reference, or the compiled
  module's, which training on a CPU passes);
- fused projection (GPUs): the model returns its last hidden states; the loss projects
  them a chunk of real tokens at a time, so the (tokens x V) logits, their fp32 copies
  and their gradient are never stored whole, and padding is never projected.

`compile_backend` ("inductor" for speed) runs the Transformer's forward (and so its
backward) through `torch.compile` with dynamic shapes, so one graph serves every batch
shape; the loss stays eager (its chunk loop depends on the token count). Source and
target widths get separate symbols even when the first batch has them equal (no "duck
sizing"), or the next batch whose widths differ would compile the model a second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from nmt_cli.core.losses import (
    LossSweep,
    label_smoothed_sums,
    projected_label_smoothed_sums,
    smoothed_loss_sweep,
)
from nmt_cli.core.transformer import Transformer


class TrainingObjective(nn.Module):
    """(smoothed loss sum, nll sum) of a batch; `tokens` is its real target count."""

    def __init__(
        self,
        model: Transformer,
        label_smoothing: float,
        pad_id: int,
        fused_projection: bool,
        compile_backend: str | None = None,
        loss_sweep: LossSweep = smoothed_loss_sweep,
    ) -> None:
        super().__init__()
        self.model = model
        self.eps = label_smoothing
        self.pad_id = pad_id
        self.fused_projection = fused_projection
        self.loss_sweep = loss_sweep
        self.compiled = compile_backend is not None
        # A plain function, not a registered module: the parameters stay the model's.
        self._forward: Callable[..., Tensor] = (
            torch.compile(model.forward, dynamic=True, backend=compile_backend)
            if compile_backend is not None
            else model.forward
        )

    def run_eagerly(self) -> None:
        """The model's own forward from now on: the fallback when compilation fails."""
        self._forward = self.model.forward
        self.compiled = False

    def _run(self, src: Tensor, tgt_in: Tensor, project: bool) -> Tensor:
        if not self.compiled:
            return self._forward(src, tgt_in, project=project)
        with _separate_size_symbols():
            return self._forward(src, tgt_in, project=project)

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, tokens: int, grad_scale: float = 1.0
    ) -> tuple[Tensor, Tensor]:
        """(smoothed loss sum, nll sum); `grad_scale`: what the trainer multiplies the loss
        by before its backward pass (the unfused loss folds it into its gradient)."""
        # The fused loss projects through the tied matrix alone; a model with an output
        # bias (imported from Marian) takes the unfused form, whose logits include it.
        if self.fused_projection and self.model.output_bias is None:
            hidden = self._run(src, tgt_in, project=False)
            return projected_label_smoothed_sums(
                hidden, self.model.output_weight, tgt_out, self.eps, self.pad_id, tokens
            )
        logits = self._run(src, tgt_in, project=True)  # read by the loss alone
        return label_smoothed_sums(
            logits, tgt_out, self.eps, self.pad_id, self.loss_sweep, grad_scale, True
        )


def _separate_size_symbols() -> contextlib.AbstractContextManager[Any]:
    """torch.compile's shape tracing without duck sizing, where this PyTorch has the
    switch (a compile-time setting, so it only needs to hold during the call)."""
    try:
        from torch.fx.experimental import _config as fx_config
    except ImportError:  # pragma: no cover - an older or newer layout
        return contextlib.nullcontext()
    if not hasattr(fx_config, "use_duck_shape"):  # pragma: no cover
        return contextlib.nullcontext()
    patch: contextlib.AbstractContextManager[Any] = fx_config.patch(  # type: ignore[attr-defined]
        use_duck_shape=False
    )
    return patch
