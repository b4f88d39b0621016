"""The model as beam search sees it, with its attention recorded on the way.

Search records whatever `decode_step(..., need_weights=True)` returns, for every row of
every step, until the batch is done. A view decides what that is: everything (pictures of
one sentence) or one averaged cross-attention row (alignments for a whole file, where all
layers and heads of every beam would take hundreds of megabytes per batch). Both wrap the
one model that translates, so the weights are those of the forward pass that chose the
output; without a view, search runs the model's fast path and records nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from torch import Tensor

from nmt_cli.core.beam_advance import Advance, decode_then_advance
from nmt_cli.core.ensemble import Ensemble, Member, members
from nmt_cli.core.open_sentence import search_loop_only
from nmt_cli.errors import NmtError

EOS = "</s>"


def default_layer(layers: int) -> int:
    """The penultimate layer (1-based), or the only one: the paper's Figures 3-5 show layer
    5 of 6, and the penultimate decoder layer's cross-attention gives the best alignments
    (Garg et al., 2019, "Jointly Learning to Align and Translate with Transformer Models")."""
    return max(1, layers - 1)


def check_layer(layer: int, layers: int, option: str, stack: str) -> int:
    """A 1-based layer number from the command line -> the 0-based index, or a clear error."""
    if not 1 <= layer <= layers:
        raise NmtError(
            f"{option} {layer}: the model has {layers} {stack} layer(s); use 1 to {layers}"
        )
    return layer - 1


def decoder_layers(model: Member | Ensemble) -> int:
    """The decoder layers whose attention can be recorded: an ensemble's members average
    theirs, so they must agree on the decoder's layers and heads (read from each model's
    configuration, whatever decodes it)."""
    shapes = {(m.cfg.decoder_layers, m.cfg.n_heads) for m in members(model)}
    if len(shapes) > 1:
        raise NmtError(
            "attention of an ensemble averages its members' weights: the members must have "
            "the same decoder layers and heads (they have "
            + ", ".join(f"{layers} layers x {heads} heads" for layers, heads in sorted(shapes))
            + ")"
        )
    return shapes.pop()[0]


@dataclass(frozen=True)
class SourceAttention:
    """weights[i][j]: how much output piece i attended to source piece j (rows sum to 1)."""

    source: list[str]  # source pieces, then "</s>"
    target: list[str]  # output pieces, then "</s>"
    weights: list[list[float]]

    @classmethod
    def of(
        cls, cross: np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
    ) -> SourceAttention:
        """From a recorded (output pieces + EOS, padded source) cross-attention matrix."""
        source, target = [*src_pieces, EOS], [*tgt_pieces, EOS]
        weights = cross[: len(target), : len(source)]
        return cls(source=source, target=target, weights=weights.tolist())


class _View:
    """Delegates the search interface to the model (or ensemble) unchanged."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def max_positions(self) -> int | None:
        return self.model.max_positions

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Any:
        return self.model.encode(src, src_mask)

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        return cast(Advance, self.model.advance(lprobs, cum, history, k))

    decode_advance = decode_then_advance  # through decode_step, which keeps the weights
    finish_sentence = search_loop_only

    def slots(self, open_sentences: int, beam: int) -> int:
        return int(self.model.slots(open_sentences, beam))

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Any,
        src_mask: Tensor,
        cache: Any,
        need_weights: bool = False,
    ) -> tuple[Tensor, Any]:
        lprobs, weights = self.model.decode_step(last_tokens, memory, src_mask, cache, need_weights)
        return lprobs, None if weights is None else self.keep(weights)

    def keep(self, weights: list[Tensor]) -> list[Tensor]:
        """What search records of one step's weights (see core.searchable.Searchable)."""
        return weights


class EveryAttention(_View):
    """Records the encoder's self-attention of the batch (here, after `encode`) and lets
    search record every decoder layer's self- and cross-attention of every step."""

    model: Member

    def __init__(self, model: Member) -> None:
        super().__init__(model)
        self.encoder: list[Tensor] = []  # one (B, h, S, S) per encoder layer

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        memory, self.encoder = self.model.encode_with_attention(src, src_mask)
        return memory


class CrossAttentionOf(_View):
    """Lets search record one decoder layer's cross-attention, averaged over heads:
    one (rows, S) tensor per step. An ensemble's weights are its members' mean."""

    def __init__(self, model: Member | Ensemble, layer: int) -> None:
        super().__init__(model)
        self.index = decoder_layers(model) + layer  # decode_step lists self-attention first

    def keep(self, weights: list[Tensor]) -> list[Tensor]:
        return [weights[self.index].float().mean(1)[:, 0]]
