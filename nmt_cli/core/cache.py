"""Key/value caches for incremental decoding, and one-query attention over them.

Each decoder layer keeps its self-attention keys/values for the prefix decoded so far
and the cross-attention keys/values of the encoder output, computed once per source.
Beam search reorders the rows after every step by an explicit index. How that reorder
is paid for decides the layout, and the layout decides how attention is computed, so
the two live together here, in two forms:

- `DecoderCache` (every model, the reference): each row's prefix is one contiguous
  (B, h, L, d) tensor, attended by PyTorch's batched products, and a reorder copies the
  prefix to its new rows. It holds float32 even when the model is bf16, because
  one-query attention is a handful of tiny batched products and oneDNN's bf16 kernels
  spend 5-7x longer on those than its float32 ones (measured in BENCHMARKS.md). The
  prefix grows into a new tensor every step rather than into a preallocated buffer: a
  slice of a larger buffer is not contiguous, and batched products over such slices
  measured 1.4-4x slower than over a contiguous prefix, which costs more than the copy
  it saves. The reorder is deferred to that copy (`pending`): one copy a step.
- `SlotCache` (bf16 and int8 models on the compiled module's kernels): keys/values stay
  where they were written, in bf16, and a small table of back-pointers says where each
  row's ancestors are; the module's attention kernel (csrc/attention.cpp) reads them
  there. A reorder moves the table, not the keys; sources are shared by their beams.
  fp32 models keep the reference form: the kernel sums in another order, and their
  outputs are promised identical to PyTorch's arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, TypeAlias

import torch
from torch import Tensor


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
            k = _gather_append(self.self_k, self.pending, k)
            v = _gather_append(self.self_v, self.pending, v)
            self.pending = None
        self.self_k, self.self_v = k, v
        return k, v

    def attend_self(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        b, h = q.size(0), self.heads
        keys, values = self.append_self(k.view(b, h, 1, -1), v.view(b, h, 1, -1))
        return self._attend(q, keys, values, None, need_weights)

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
        """softmax(QK^T / sqrt(d_k)) V as two small batched products in the cache's dtype,
        which at one query per row beat the fused SDPA kernel on CPUs; the first product
        also masks (`baddbmm`). Rows x heads are folded into one batch dimension (free
        views of the contiguous cache): bmm directly, without matmul's reshapes."""
        b, h, keys, d_k = k.shape
        bh = b * h
        q = q.to(self.dtype).reshape(bh, 1, d_k)
        k_t = k.view(bh, keys, d_k).transpose(1, 2)
        scale = 1.0 / math.sqrt(d_k)
        if bias is None:
            scores = torch.bmm(q, k_t).mul_(scale)
        else:
            scores = torch.baddbmm(bias.view(bh, 1, keys), q, k_t, alpha=scale)
        weights = scores.softmax(-1)
        ctx = torch.bmm(weights, v.view(bh, keys, v.size(-1))).view(b, -1)
        return ctx, weights.view(b, h, 1, keys) if need_weights else None

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
    def empty(cls, n_layers: int, dtype: torch.dtype, heads: int) -> DecoderCache:
        return cls([LayerCache(dtype, heads) for _ in range(n_layers)])

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


@dataclass
class SlotTable:
    """What the layers of a SlotCache share: the back-pointers, each row's source, the
    position, the buffers' size. It is its own object so that the layers need no
    reference to the cache holding them: that cycle kept each batch's buffers alive until
    Python's cycle collector ran, and memory grew with the input."""

    kernel: ModuleType
    heads: int
    d_k: int
    d_v: int
    dtype: torch.dtype
    slots: Tensor | None = None  # (B, steps) int64
    sources: Tensor | None = None  # (B,) int64: each row's source in the cross tensors
    length: int = 0  # positions written
    steps: int = 0  # positions the buffers hold
    width: int = 0  # slots the buffers hold: the most rows a step had
    reserved: int = 0  # the search's length limit, when it said
    prepared: int = -1  # the position `slots` was last prepared for
    size: int = 0  # counts the changes of (width, steps): the layers' buffers follow

    def prepare(self, rows: int) -> Tensor:
        """Make room for this step's `rows` rows and return the slot table for it."""
        if self.prepared == self.length and self.slots is not None:
            return self.slots
        if rows > self.width:
            self.width, self.size = rows, self.size + 1
        if self.length >= self.steps:
            steps = max(32, self.reserved, 2 * self.steps)
            table = torch.arange(rows).unsqueeze(1).repeat(1, steps)
            if self.slots is not None:
                table[:, : self.length].copy_(self.slots[:, : self.length])
            self.slots, self.steps, self.size = table, steps, self.size + 1
        assert self.slots is not None
        self.slots[:, self.length].copy_(torch.arange(rows))
        self.prepared = self.length
        return self.slots

    def buffer(self, old: Tensor | None, d: int) -> Tensor:
        """`old` (W, T, h, d) if it is as large as the table wants, else a larger one
        with the steps written so far. Left uninitialised: the table only ever points at
        slots a step wrote."""
        if old is not None and old.size(0) >= self.width and old.size(1) >= self.steps:
            return old
        new = torch.empty(self.width, self.steps, self.heads, d, dtype=self.dtype)
        if old is not None:
            new[: old.size(0), : self.length].copy_(old[:, : self.length])
        return new

    def weights_out(self, rows: int, keys: int) -> Tensor:
        return torch.empty(rows, self.heads, keys, dtype=torch.float32)


@dataclass
class SlotLayer:
    """One layer's part of a SlotCache."""

    table: SlotTable
    self_k: Tensor | None = None  # (W, T, h, d_k): step s of slot w at [w, s]
    self_v: Tensor | None = None  # (W, T, h, d_v)
    cross_k: Tensor | None = None  # (N, S, h, d_k): one per source, not per beam
    cross_v: Tensor | None = None
    cross_bias: Tensor | None = None  # (N, S) float32, -inf at padding; None: no padding
    size: int = -1  # the table's `size` the buffers were made for

    def make_room(self) -> tuple[Tensor, Tensor]:
        """The buffers, grown to what the table was last prepared for."""
        table = self.table
        if self.size != table.size or self.self_k is None or self.self_v is None:
            self.self_k = table.buffer(self.self_k, table.d_k)
            self.self_v = table.buffer(self.self_v, table.d_v)
            self.size = table.size
        return self.self_k, self.self_v

    def attend_self(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        table = self.table
        b, position = q.size(0), table.length
        slots = table.prepare(b)
        keys, values = self.make_room()
        weights = table.weights_out(b, position + 1) if need_weights else None
        ctx = table.kernel.attend_prefix(  # writes k, v into the buffers first
            q, k, v, keys, values, slots, position + 1, 1.0 / math.sqrt(table.d_k), weights
        )
        return ctx, None if weights is None else weights.unsqueeze(2)

    def has_memory(self) -> bool:
        return self.cross_k is not None

    def store_memory(self, k: Tensor, v: Tensor, key_mask: Tensor) -> None:
        table = self.table
        self.cross_k = k.transpose(1, 2).to(table.dtype).contiguous()
        self.cross_v = v.transpose(1, 2).to(table.dtype).contiguous()
        if not bool(key_mask.all()):
            mask = key_mask.view(key_mask.size(0), -1)
            bias = torch.zeros(mask.shape, dtype=torch.float32)
            self.cross_bias = bias.masked_fill_(~mask, float("-inf"))
        if table.sources is None:
            table.sources = torch.arange(k.size(0))

    def attend_memory(self, q: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        table = self.table
        assert self.cross_k is not None and self.cross_v is not None, "no memory stored"
        assert table.sources is not None
        weights = table.weights_out(q.size(0), self.cross_k.size(1)) if need_weights else None
        ctx = table.kernel.attend_memory(
            q,
            self.cross_k,
            self.cross_v,
            table.sources,
            self.cross_bias,
            1.0 / math.sqrt(table.d_k),
            weights,
        )
        return ctx, None if weights is None else weights.unsqueeze(2)


class SlotCache:
    """Keys/values that never move, for the compiled module's attention kernel (CPUs).

    Row r of a step writes its keys into slot r at that step's position. `slots[r, s]`
    is the slot where row r's ancestor of step s wrote them; search's reorder only
    selects rows of this table. Column `length` is set to row ids just before each step
    (the step's own keys are in slot r), so that a reorder after the step gives the new
    rows their parents' slots. Buffers are sized to the search's length limit when it
    says (`reserve`), else double as the output grows, and widen to the most rows a step
    had (beam search's first reorder, from sentences to beams).
    """

    def __init__(
        self,
        kernel: ModuleType,
        heads: int,
        d_k: int,
        d_v: int,
        n_layers: int,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.table = SlotTable(kernel, heads, d_k, d_v, dtype)
        self.layers = [SlotLayer(self.table) for _ in range(n_layers)]

    @property
    def length(self) -> int:
        return self.table.length

    @length.setter
    def length(self, value: int) -> None:
        self.table.length = value

    def reserve(self, steps: int) -> None:
        """Allocate the buffers for `steps` positions when they are first needed: no
        regrowth and copying later. Untouched memory costs nothing (the kernel never
        commits pages no step wrote), so the search's length limit is affordable."""
        self.table.reserved = steps

    def prepare(self, rows: int) -> Tensor:
        """Room for this step's keys of `rows` rows in every layer; -> the slot table."""
        slots = self.table.prepare(rows)
        for layer in self.layers:
            layer.make_room()
        return slots

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep rows `index` (B',) in that order: their back-pointers and sources move,
        the keys stay. With cross=False rows stay within their sentence (search's word
        for beams reordering), so the sources cannot change."""
        table = self.table
        if table.slots is not None:
            table.slots = table.slots.index_select(0, index)
        if cross and table.sources is not None:
            table.sources = table.sources.index_select(0, index)


# Either cache: what Transformer.new_cache makes, decode_step advances and search reorders.
StepCache: TypeAlias = DecoderCache | SlotCache
