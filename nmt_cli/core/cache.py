"""Key/value caches for incremental decoding, and one-query attention over them.

Each decoder layer keeps its self-attention keys/values for the prefix decoded so far
and the cross-attention keys/values of the encoder output, computed once per source.
Beam search reorders the rows after every step by an explicit index. How that reorder
is paid for decides the layout, and the layout decides how attention is computed, so
the two live together here, in two forms:

- `DecoderCache` (every model, the reference): each row's prefix is one contiguous
  (B, h, L, d) tensor in the dtype it was made with (the model's, unless a backend asks
  for another), attended by the reference attention, and a reorder copies the prefix
  to its new rows. The prefix grows into a new tensor every step rather than into a
  preallocated buffer: a slice of a larger buffer is not contiguous, and batched
  products over such slices are slower than the copy saves (BENCHMARKS.md). The
  reorder is deferred to that copy (`pending`): one copy a step. With a restricted
  attention window r (core/local_attention.py) that copy leaves out the
  oldest position once r are kept, so the cache, and the step's cost, stop growing.

A decoding backend may bring a cache of its own layout (the CPU backend's keeps keys
where they are written and attends with its own kernel): the decoder step asks only for
what `StepCache` and `AttentionCache` describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.core.attention import attention_with_weights


class AttentionCache(Protocol):
    """What a decoder layer's attention asks of its cache, in either layout."""

    def attend_self(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Append this step's k, v (B, h * d) and attend the whole prefix with q (B, h * d_k):
        -> context (B, h * d_v) in q's dtype, and the weights (B, h, 1, L) when asked."""
        ...

    def has_memory(self) -> bool: ...

    def store_memory(self, k: Tensor, v: Tensor, key_mask: Tensor) -> None:
        """The encoder output's keys/values (B, h, S, d) and its key mask (B, 1, 1, S)."""
        ...

    def attend_memory(self, q: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]: ...


@dataclass
class LayerCache:
    """Tensors are (B, h, L, d): B rows of the (flattened) batch x beam."""

    dtype: torch.dtype
    heads: int
    window: int = 0  # keep only the newest `window` positions; 0: all of them
    appended: int = 0  # positions appended so far, kept or not
    self_k: Tensor | None = None
    self_v: Tensor | None = None
    # Rows of self_k/self_v the next step continues (search's reorder, applied as the
    # next position is appended); None: all of them, in order.
    pending: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    cross_bias: Tensor | None = None  # (B, h, 1, S); None when no source has padding

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys/values (B, h, 1, d) and return the whole prefix's."""
        if self.self_k is None or self.self_v is None:
            k, v = k.to(self.dtype).contiguous(), v.to(self.dtype).contiguous()
        else:
            k = _gather_append(self._kept(self.self_k), self.pending, k)
            v = _gather_append(self._kept(self.self_v), self.pending, v)
            self.pending = None
        self.self_k, self.self_v = k, v
        self.appended += 1
        return k, v

    def _kept(self, prefix: Tensor) -> Tensor:
        """The positions the next query still sees: with a window, its newest r - 1."""
        drop = prefix.size(2) - (self.window - 1)
        return prefix.narrow(2, drop, self.window - 1) if self.window and drop > 0 else prefix

    def attend_self(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        b, h = q.size(0), self.heads
        keys, values = self.append_self(k.view(b, h, 1, -1), v.view(b, h, 1, -1))
        ctx, weights = self._attend(q, keys, values, None, need_weights)
        if weights is not None and self.window:  # zeros for positions out of the window
            weights = F.pad(weights, (self.appended - weights.size(-1), 0))
        return ctx, weights

    def has_memory(self) -> bool:
        return self.cross_k is not None

    def store_memory(self, k: Tensor, v: Tensor, key_mask: Tensor) -> None:
        self.cross_k = k.to(self.dtype).contiguous()
        self.cross_v = v.to(self.dtype).contiguous()
        if not bool(key_mask.all()):
            b, keys = key_mask.size(0), key_mask.size(-1)
            bias = torch.zeros(b, self.heads, 1, keys, dtype=self.dtype, device=k.device)
            self.cross_bias = bias.masked_fill_(~key_mask, float("-inf"))

    def attend_memory(self, q: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        assert self.cross_k is not None and self.cross_v is not None, "no memory stored"
        return self._attend(q, self.cross_k, self.cross_v, self.cross_bias, need_weights)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The reference attention (core/attention.py) of one query per row, in the
        cache's dtype: (B, h * d_k) against (B, h, L, d) -> (B, h * d_v)."""
        b = k.size(0)
        ctx, weights = attention_with_weights(
            q.to(self.dtype).view(b, self.heads, 1, -1), k, v, bias
        )
        return ctx.view(b, -1), weights if need_weights else None

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
    def empty(cls, n_layers: int, dtype: torch.dtype, heads: int, window: int = 0) -> DecoderCache:
        return cls([LayerCache(dtype, heads, window) for _ in range(n_layers)])

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep rows `index` (B',) of every cached tensor, in that order.

        Reordering beams within a sentence leaves the cross-attention keys/values as they
        are (all beams of one sentence share them), so search passes `cross=False` then
        and only the self-attention prefix moves, at the next step's append.
        """
        for layer in self.layers:
            layer.reorder(index, cross)

    def reserve(self, steps: int) -> None:
        """Nothing to do: the prefix is a new tensor every step."""


class StepCache(Protocol):
    """What a decoder step and search ask of a whole cache, in any layout."""

    length: int  # positions already decoded; the next step's position index

    @property
    def layers(self) -> Sequence[AttentionCache]: ...

    def reorder(self, index: Tensor, cross: bool = True) -> None: ...

    def reserve(self, steps: int) -> None: ...
