"""A batch of one sentence handed to the model for the rest of its beam search.

At one sentence a step of beam search is a few hundred microseconds of the model's work
and tens of search's own Python around it (the stopping bound, the cache's back-pointers,
setting hypotheses aside). A model that can run search's loop itself (the CPU backend's
compiled step, backends/cpu/step.py) is handed the search's state between two steps
(`OpenSentence`) and returns the hypotheses that end (`Ended`); search sets them aside as
its own (core/search.py). Its loop is the reference, and every such route is tested to
give its results exactly; models without one say so with `search_loop_only`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import Tensor


@dataclass(frozen=True)
class OpenSentence:
    """A batch of one sentence between two steps of beam search, or before the first
    (step 0: every beam's token BOS, only the first beam open, the cache empty): what a
    model needs to carry its search to the end by a faster route
    (`Searchable.finish_sentence`)."""

    tokens: Tensor  # (K,) each beam's newest token
    cum: Tensor  # (K,) float32 running scores, -inf where a beam closed
    history: Tensor  # (K, L) each beam's tokens so far
    step: int  # the next step (the cache holds this many positions)
    beam: int
    nbest: int
    alpha: float
    limit: int  # its length limit: EOS is forced from this step on
    lp_at_limit: float  # the length penalty at the limit
    finished: list[float]  # the scores of its hypotheses set aside, as _BeamSearch keeps them
    any_finished: bool  # whether any hypothesis of the batch has ended


class Ended(NamedTuple):
    """A hypothesis that ended with EOS at `step`: its tokens without EOS, its
    log-probability with it."""

    tokens: list[int]
    log_prob: float
    step: int


def search_loop_only(
    model: Any, sentence: OpenSentence, memory: Any, src_mask: Tensor, cache: Any
) -> list[Ended] | None:
    """`Searchable.finish_sentence` of every model without a faster route (a method:
    `finish_sentence = search_loop_only` in its class): search's own loop, the
    reference, runs every step."""
    return None
