"""Beam search's bookkeeping after each model call, with its native reference.

After the model scores a step, beam search adds each candidate's log-probability to
its row's running score, picks each sentence's K best of its K*V candidates, and keeps
the books: which row each continues, its tokens so far, which ones end. `torch_advance`
does that in a dozen tensor operations on any device, the reference; a backend may do
the same in one call (the CPU backend's `beam_advance`, tested against it), and the
model search decodes says which (`Searchable.advance`).

A whole step of beam search after its first is `decode_then_advance`: the model's
log-probabilities, EOS forced on the rows at their length limit, then `advance`. A model
may do the same without ever writing the log-probabilities out (the CPU backend's fused
log-softmax and choice, tested equal to it): search asks the model for the whole step
(`Searchable.decode_advance`), and every model that has nothing faster answers with
`decode_then_advance`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID


class Advance(NamedTuple):
    """One step of beam search's bookkeeping after the model, for N sentences of K beams."""

    top_lp: Tensor  # (N, K) the chosen candidates' scores, best first
    cum: Tensor  # (N, K) the same with candidates ending in EOS closed (-inf)
    tokens: Tensor  # (N, K) their tokens
    origin: Tensor  # (N*K,) the row each continues
    history: Tensor  # (N*K, L+1) that row's tokens, then this one
    ended: Tensor  # (N, K) finite candidates that end in EOS
    any_ended: bool


# (log-probabilities (N*K, V), running scores (N*K,), token histories (N*K, L), K) ->
# the step's Advance. PAD and BOS are never chosen (set to -inf in the log-probabilities).
BeamAdvance = Callable[[Tensor, Tensor, Tensor, int], Advance]


def torch_advance(lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
    """Any device's: the sums in place, then one `topk` over each sentence's K*V of them
    (no full-vocabulary sort), a dozen tensor operations in all: the reference. A
    decoding backend may do the same in one call that chooses in one pass, where equal
    scores may rank differently."""
    mask_specials(lprobs)
    n, vocab = lprobs.size(0) // k, lprobs.size(1)
    top_lp, flat = lprobs.add_(cum.view(-1, 1)).view(n, -1).topk(k, dim=1)
    tokens = flat.remainder(vocab)
    first_rows = torch.arange(n, device=flat.device)[:, None] * k
    origin = torch.div(flat, vocab, rounding_mode="floor").add_(first_rows).view(-1)
    history = torch.cat([history.index_select(0, origin), tokens.view(-1, 1)], dim=1)
    return with_ends(top_lp, tokens, origin, history)


def with_ends(top_lp: Tensor, tokens: Tensor, origin: Tensor, history: Tensor) -> Advance:
    eos = tokens == EOS_ID
    ended = eos & (top_lp > -math.inf)  # a closed slot's candidates are -inf
    cum = top_lp.masked_fill(eos, -math.inf)
    return Advance(top_lp, cum, tokens, origin, history, ended, bool(ended.any()))


def mask_specials(lprobs: Tensor) -> None:
    """Padding and BOS are never generated: one fill of the strided view over both
    columns (no index tensor to build or copy to a GPU every step)."""
    lprobs[:, PAD_ID : BOS_ID + 1 : BOS_ID - PAD_ID].fill_(-math.inf)


def force_eos(lprobs: Tensor, rows: Tensor) -> None:
    """Rows that reached their maximum length may only end: everything but EOS is -inf."""
    eos = lprobs[rows, EOS_ID]
    lprobs[rows] = -math.inf
    lprobs[rows, EOS_ID] = eos


class _Steps(Protocol):
    """What decode_then_advance needs of a model (core/searchable.py's Searchable has it)."""

    def decode_step(
        self, last_tokens: Tensor, memory: Any, src_mask: Tensor, cache: Any
    ) -> tuple[Tensor, Any]: ...

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance: ...


def decode_then_advance(
    model: _Steps,
    last_tokens: Tensor,
    memory: Any,
    src_mask: Tensor,
    cache: Any,
    cum: Tensor,
    history: Tensor,
    k: int,
    at_limit: Tensor | None,
) -> Advance:
    """One step of beam search after the first, the reference: the model's
    log-probabilities for the rows' newest tokens, EOS forced on the rows `at_limit`
    (rows,) marks (None: none), then the model's `advance` over the running scores `cum`
    (rows,) and the histories."""
    lprobs, _ = model.decode_step(last_tokens, memory, src_mask, cache)
    if at_limit is not None:
        force_eos(lprobs, at_limit.nonzero().squeeze(1))
    return model.advance(lprobs, cum, history, k)
