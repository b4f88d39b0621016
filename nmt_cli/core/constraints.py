"""Constrained search: a state machine per hypothesis that says which tokens may come next.

A constraint (a parse tree that must stay well-formed, a prefix to start with, phrases to
contain) is a `ConstraintState`: the state of every row of a search (one hypothesis each),
as tensors. Before search chooses, it sets to -inf the log-probabilities of the tokens a
row may not take next (EOS too, until the constraint is met); after, it is advanced by the
tokens chosen and reordered with the rows.

Search has no constraint case in its loop: `constrain` wraps the model in `Constrained`, a
`Searchable` like any other (the ensemble's design, core/ensemble.py). It masks every
step's log-probabilities in `decode_step`, advances the states by the tokens each step is
fed (those the previous step chose), and reorders them where search reorders the cache,
the one place search says which row continues which. Without a constraint search runs
the model itself: no work per step.

Length: `constrain` raises each sentence's length limit to what its constraint needs at
least (a tree's closing brackets, a phrase not yet written), within the decoder's
positions, and the state is told the room each row has left, so that it allows only tokens
after which the row can still finish. Only a constraint longer than the decoder's
positions can reach the limit unmet; there search forces EOS as always (callers refuse
such constraints first). A state may also choose beam search's candidates itself
(`choose`: dynamic beam allocation for phrases); None leaves that to the model's `advance`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from nmt_cli.core.beam_advance import Advance, decode_then_advance
from nmt_cli.core.open_sentence import search_loop_only


class ConstraintState(Protocol):
    """The constraint's state of every row of a search, one row per sentence at first."""

    def need(self) -> Tensor:
        """(rows,) long: the fewest tokens each row must still emit before it may end."""
        ...

    def mask(self, lprobs: Tensor, room: Tensor) -> None:
        """Set to -inf, in place, the log-probabilities (rows, V) of every token a row may
        not take next. `room` (rows,) >= 1: tokens a row may still emit before EOS is
        forced; a token is allowed only if what the row then needs fits in room - 1, and
        EOS only once the constraint is met."""
        ...

    def advance(self, tokens: Tensor) -> None:
        """Each row took tokens[row] (a closed beam's row may take anything: its state
        may become meaningless, but must not fail)."""
        ...

    def reorder(self, index: Tensor) -> None:
        """Row i continues old row index[i] (rows may be dropped or repeated)."""
        ...

    def choose(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance | None:
        """Beam search's candidates for this step (Searchable.advance's contract, on the
        masked log-probabilities), or None: the model's advance chooses."""
        ...


def constrain(model: Any, state: ConstraintState, limit: Tensor) -> tuple[Constrained, Tensor]:
    """`model` searched under `state` (one row per sentence), and the sentences' length
    limits (tokens before EOS) raised to what the constraint needs, within the decoder's
    positions. Search uses both in place of its own."""
    limit = torch.maximum(limit, state.need().to(limit))
    if model.max_positions is not None:
        limit = limit.clamp(max=model.max_positions - 1)
    return Constrained(model, state, limit), limit


class Constrained:
    """A Searchable whose log-probabilities are masked by a constraint state, which it
    keeps in step with the search (see the module docstring)."""

    def __init__(self, model: Any, state: ConstraintState, limit: Tensor) -> None:
        self.model, self.state = model, state
        self.room = limit.clone()  # per row: tokens it may still emit before EOS is forced
        self.started = False

    @property
    def max_positions(self) -> int | None:
        return self.model.max_positions

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Any:
        return self.model.encode(src, src_mask)

    def new_cache(self) -> _Cache:
        return _Cache(self.model.new_cache(), self)

    def slots(self, open_sentences: int, beam: int) -> int:
        return self.model.slots(open_sentences, beam)

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Any,
        src_mask: Tensor,
        cache: _Cache,
        need_weights: bool = False,
    ) -> tuple[Tensor, Any]:
        if self.started:  # the tokens the previous step chose
            self.state.advance(last_tokens)
            self.room -= 1
        self.started = True
        if need_weights:
            out = self.model.decode_step(last_tokens, memory, src_mask, cache.inner, True)
        else:
            out = self.model.decode_step(last_tokens, memory, src_mask, cache.inner)
        lprobs = out[0]
        # A row at its limit is left as the model scored it: search forces its EOS.
        ending = (self.room <= 0).nonzero().squeeze(1)
        kept = lprobs[ending] if ending.numel() else None
        self.state.mask(lprobs, self.room.clamp(min=1))
        if kept is not None:
            lprobs[ending] = kept
        return lprobs, out[1]

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        chosen = self.state.choose(lprobs, cum, history, k)
        return chosen if chosen is not None else self.model.advance(lprobs, cum, history, k)

    decode_advance = decode_then_advance  # the constraint masks the log-probabilities
    finish_sentence = search_loop_only

    def reorder(self, index: Tensor) -> None:
        self.state.reorder(index)
        self.room = self.room.index_select(0, index)


class _Cache:
    """The model's cache, whose reorders also reorder the constraint's rows."""

    def __init__(self, inner: Any, owner: Constrained) -> None:
        self.inner, self.owner = inner, owner

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        self.inner.reorder(index, cross)
        self.owner.reorder(index)

    def reserve(self, steps: int) -> None:
        self.inner.reserve(steps)
