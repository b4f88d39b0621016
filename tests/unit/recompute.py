"""The reference of every decoding cache: a searchable model with no incremental state.

Every step runs the teacher-forced decoder (the training path) over the whole prefix and
keeps the last position; its cache is just the prefixes, reordered by search like any
other. Beam search over it is what a cache (the reference one, a trimmed one, a compiled
step's) must reproduce."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt_cli.core.beam_advance import decode_then_advance
from nmt_cli.core.open_sentence import search_loop_only
from nmt_cli.core.transformer import Transformer


class Prefixes:
    """The tokens so far of every row, and each row's sentence in the batch."""

    def __init__(self) -> None:
        self.tokens = torch.empty(0, 0, dtype=torch.long)
        self.rows = torch.empty(0, dtype=torch.long)

    def append(self, last: Tensor) -> None:
        if self.tokens.numel() == 0:
            self.tokens = last[:, None]
            self.rows = torch.arange(last.size(0))
        else:
            self.tokens = torch.cat([self.tokens, last[:, None]], 1)

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        self.tokens, self.rows = self.tokens[index], self.rows[index]

    def reserve(self, steps: int) -> None:
        pass


class FullRecompute:
    """`model` decoded by recomputing every prefix (see the module's docstring)."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.max_positions = model.max_positions
        self.advance, self.slots = model.advance, model.slots

    decode_advance = decode_then_advance  # through the recomputing decode_step
    finish_sentence = search_loop_only

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.model.encode(src, src_mask)

    def new_cache(self) -> Prefixes:
        return Prefixes()

    def decode_step(
        self, last: Tensor, memory: Any, src_mask: Tensor, cache: Prefixes, **_: Any
    ) -> tuple[Tensor, None]:
        cache.append(last)
        memory = memory.index_select(0, cache.rows)  # search reorders only the cache
        hidden = self.model.decode(cache.tokens, memory, src_mask).hidden
        return torch.log_softmax(self.model.logits(hidden[:, -1]), -1, dtype=torch.float32), None
