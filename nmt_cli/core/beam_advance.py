"""Beam search's bookkeeping after each model call, with its native reference.

After the model scores a step, beam search adds each candidate's log-probability to
its row's running score, picks each sentence's K best of its K*V candidates, and keeps
the books: which row each continues, its tokens so far, which ones end. `torch_advance`
does that in a dozen tensor operations on any device, the reference; a backend may do
the same in one call (the CPU backend's `beam_advance`, tested against it), and the
model search decodes says which (`Searchable.advance`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

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
