"""Key/value cache for incremental decoding.

Each decoder layer keeps its self-attention keys/values for the prefix decoded so far
and the cross-attention keys/values of the encoder output, computed once per source,
with the source padding as `cross_bias`, -inf where a key is padding and 0 elsewhere,
one row per head: the step adds it to the scores in the same product that computes
them. Beam search reorders the cache by an explicit index after every step.

The tensors are held in `dtype`, which need not be the model's: on a CPU the decoder
attends in float32 even when its matrices are bf16, because one-query attention is a
handful of tiny batched products, and oneDNN's bf16 kernels spend 5-7x longer on those
than the float32 ones do (measured in BENCHMARKS.md). The prefix grows by concatenation
rather than into a preallocated buffer: a slice of a larger buffer is not contiguous,
and batched products over such slices measured 1.4-4x slower than over the
concatenated tensor, which costs more than the copies it saves.
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
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    cross_bias: Tensor | None = None  # (B, h, 1, S); None when no source has padding

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys/values and return the whole prefix's, in the cache dtype."""
        if self.self_k is None or self.self_v is None:
            k, v = k.to(self.dtype).contiguous(), v.to(self.dtype).contiguous()
        else:
            # cat promotes the new position to the cache's dtype (float32 or the
            # model's own) as it copies, without a separate cast
            k = torch.cat([self.self_k, k], dim=2)
            v = torch.cat([self.self_v, v], dim=2)
        self.self_k, self.self_v = k, v
        return k, v


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
        and copies only the self-attention prefix.
        """
        for layer in self.layers:
            if layer.self_k is not None and layer.self_v is not None:
                layer.self_k = layer.self_k.index_select(0, index)
                layer.self_v = layer.self_v.index_select(0, index)
            if cross and layer.cross_k is not None and layer.cross_v is not None:
                layer.cross_k = layer.cross_k.index_select(0, index)
                layer.cross_v = layer.cross_v.index_select(0, index)
                if layer.cross_bias is not None:
                    layer.cross_bias = layer.cross_bias.index_select(0, index)
