"""Key/value cache for incremental decoding.

Each decoder layer keeps its self-attention keys/values for the prefix decoded so far
and the cross-attention keys/values of the encoder output, computed once per source,
with the source padding as `cross_bias`, -inf where a key is padding and 0 elsewhere,
one row per head: the step adds it to the scores in the same product that computes
them. Beam search reorders the cache by an explicit index after every step.

The tensors are held in `dtype`, which need not be the model's: on a CPU the decoder
attends in float32 even when its matrices are bf16, because one-query attention is a
handful of tiny batched products, and oneDNN's bf16 kernels spend 5-7x longer on those
than the float32 ones do (measured in BENCHMARKS.md). The prefix grows into a new
tensor every step rather than into a preallocated buffer: a slice of a larger buffer is
not contiguous, and batched products over such slices measured 1.4-4x slower than over
a contiguous prefix, which costs more than the copy it saves. Search's reorder of the
rows is deferred to that copy (`pending`), so the prefix is copied once a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """Tensors are (B, h, L, d): B rows of the (flattened) batch x beam."""

    dtype: torch.dtype
    self_k: Tensor | None = None
    self_v: Tensor | None = None
    # Rows of self_k/self_v the next step continues (search's reorder, applied as the
    # next position is appended); None: all of them, in order.
    pending: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    cross_bias: Tensor | None = None  # (B, h, 1, S); None when no source has padding

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys/values and return the whole prefix's, in the cache dtype."""
        if self.self_k is None or self.self_v is None:
            k, v = k.to(self.dtype).contiguous(), v.to(self.dtype).contiguous()
        else:
            k = _gather_append(self.self_k, self.pending, k)
            v = _gather_append(self.self_v, self.pending, v)
            self.pending = None
        self.self_k, self.self_v = k, v
        return k, v

    def reorder(self, index: Tensor, cross: bool) -> None:
        if self.self_k is not None:
            self.pending = index if self.pending is None else self.pending.index_select(0, index)
        if cross and self.cross_k is not None and self.cross_v is not None:
            self.cross_k = self.cross_k.index_select(0, index)
            self.cross_v = self.cross_v.index_select(0, index)
            if self.cross_bias is not None:
                self.cross_bias = self.cross_bias.index_select(0, index)


def _gather_append(prefix: Tensor, rows: Tensor | None, new: Tensor) -> Tensor:
    """`cat([prefix[rows], new], dim=2)` written straight into one new tensor: the rows
    are gathered in the same pass that copies the prefix (and `new` is cast to the
    prefix's dtype as it is copied), so a step copies the prefix once, not twice."""
    if torch.is_grad_enabled() or prefix.device.type != "cpu":
        # out= is not differentiable; GPUs, with bandwidth to spare, take the plain path
        kept = prefix if rows is None else prefix.index_select(0, rows)
        return torch.cat([kept, new.to(prefix.dtype)], dim=2)
    _, h, length, d = prefix.shape
    out = prefix.new_empty(new.size(0), h, length + 1, d)
    if rows is None:
        out.narrow(2, 0, length).copy_(prefix)
    else:
        torch.index_select(prefix, 0, rows, out=out.narrow(2, 0, length))
    out.narrow(2, length, 1).copy_(new)
    return out


@dataclass
class DecoderCache:
    layers: list[LayerCache]
    length: int = 0  # positions already decoded; the next step's position index

    @classmethod
    def empty(cls, n_layers: int, dtype: torch.dtype) -> DecoderCache:
        return cls([LayerCache(dtype) for _ in range(n_layers)])

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep rows `index` (B',) of every cached tensor, in that order.

        Reordering beams within a sentence leaves the cross-attention keys/values as they
        are (all beams of one sentence share them), so search passes `cross=False` then
        and only the self-attention prefix moves, at the next step's append.
        """
        for layer in self.layers:
            layer.reorder(index, cross)
