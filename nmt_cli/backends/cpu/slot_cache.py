"""The SlotCache: keys/values that never move, attended by the compiled module's kernel.

The reference cache (core/cache.py's DecoderCache) keeps each row's prefix contiguous
for PyTorch's batched products, so every beam reorder copies the prefix. Beam search
only ever points a row at its parent, so here keys/values stay where a step wrote them
(in bf16 beside bf16 and int8 products, float32 beside fp32 ones), and a small table of
back-pointers says where each row's ancestors are; the module's attention kernel
(csrc/attention.cpp) follows the table, and serves cross-attention with one copy of each
source's keys for all its beams. A reorder moves the table, not the keys. The kernel
sums in another order than PyTorch's products, so only models whose arithmetic already
differs in the last bits (those on the module's products: fp32, bf16, int8) decode over
it (backends/cpu/decoder.py decides).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor


@dataclass
class SlotTable:
    """What the layers of a SlotCache share: the back-pointers, each row's source, the
    position, the buffers' size. It is its own object so that the layers need no
    reference to the cache holding them: such a cycle keeps each batch's buffers alive
    until Python's cycle collector runs, and memory grows with the input."""

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
    rows: Tensor | None = None  # 0, 1, ..., width - 1: each step's own column

    def prepare(self, rows: int) -> Tensor:
        """Make room for this step's `rows` rows and return the slot table for it."""
        if self.prepared == self.length and self.slots is not None:
            return self.slots
        if rows > self.width:
            self.width, self.size = rows, self.size + 1
            self.rows = torch.arange(rows)  # made once, not at every step
        assert self.rows is not None
        if self.length >= self.steps:
            steps = max(32, self.reserved, 2 * self.steps)
            table = self.rows[:rows].unsqueeze(1).repeat(1, steps)
            if self.slots is not None:
                table[:, : self.length].copy_(self.slots[:, : self.length])
            self.slots, self.steps, self.size = table, steps, self.size + 1
        assert self.slots is not None
        self.slots[:, self.length].copy_(self.rows[:rows])
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
        if self.layers[0].size != self.table.size:  # the layers follow the table together
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

    @contextmanager
    def only(self, rows: Tensor) -> Iterator[Tensor]:
        """A step over `rows` (R',) of the table alone (their back-pointers and sources),
        then every row back: those among `rows` with what the step wrote, the others
        with the first one's back-pointers (they must be closed beams, never read again:
        search's next reorder gives a beam its parent's row) and their own sources, so
        that reorders within a sentence (cross=False) stay right. Yields, for every row,
        its place among `rows`, -1 for the others."""
        table = self.table
        assert table.slots is not None, "a step has prepared the table"
        sources = table.sources
        place = torch.full((table.slots.size(0),), -1, dtype=torch.long)
        place[rows] = torch.arange(rows.numel())
        self.reorder(rows)
        try:
            yield place
        finally:
            self.reorder(place.clamp(min=0), cross=False)
            table.sources = sources
