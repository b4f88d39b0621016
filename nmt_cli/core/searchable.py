"""What search sees of a model (core/search.py): `Searchable`, and the cache's part.

Search knows nothing of layers or kernels: the Transformer, a backend's wrapper of one
(backends/cpu/decoder.py's CpuDecoder), an Ensemble (core/ensemble.py), a constraint's
wrapper (core/constraints.py) or a scripted stub in the tests is searched the same way,
through these methods alone.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from nmt_cli.core.beam_advance import Advance
from nmt_cli.core.open_sentence import Ended, OpenSentence


class Cache(Protocol):
    def reorder(self, index: Tensor, cross: bool = True) -> None: ...

    def reserve(self, steps: int) -> None:
        """The most positions search will decode into it: a hint for caches that
        allocate ahead (the others grow as they go)."""
        ...


class Searchable(Protocol):
    """What search needs of a model: the Transformer and the Ensemble have it, tests use
    scripted stubs. `memory` and the cache are opaque to search: it passes back what
    `encode` and `new_cache` gave it, and reorders the cache only through `reorder`."""

    @property
    def max_positions(self) -> int | None:
        """Target positions the decoder has (None: unbounded); caps the output length."""
        ...

    def source_mask(self, src: Tensor) -> Tensor: ...

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Any: ...

    def new_cache(self) -> Cache: ...

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Any,
        src_mask: Tensor,
        cache: Any,
        need_weights: bool = False,
    ) -> tuple[Tensor, Any]:
        """-> (log-probabilities (rows, V), with need_weights a list of row-first tensors
        to record, else anything). Search passes need_weights only when recording."""
        ...

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        """Beam search's bookkeeping after a step (core/beam_advance.py: `torch_advance`
        is the reference)."""
        ...

    def decode_advance(
        self,
        last_tokens: Tensor,
        memory: Any,
        src_mask: Tensor,
        cache: Any,
        cum: Tensor,
        history: Tensor,
        k: int,
        at_limit: Tensor | None,
    ) -> Advance:
        """A whole step of beam search after the first, when nothing is recorded:
        core/beam_advance.py's `decode_then_advance` (decode_step, EOS forced on the
        rows `at_limit` marks, advance) or the same results by a faster route."""
        ...

    def slots(self, open_sentences: int, beam: int) -> int:
        """Sentence slots the batch keeps for `open_sentences` still open: at least that
        many; more keeps finished ones as filler, for implementations whose cost depends
        on the number of distinct batch shapes."""
        ...

    def finish_sentence(
        self, sentence: OpenSentence, memory: Any, src_mask: Tensor, cache: Any
    ) -> list[Ended] | None:
        """The hypotheses that end in the rest of a one-sentence search, as search's loop
        finds and sets them aside, by a faster route; None: none (`search_loop_only`)."""
        ...
