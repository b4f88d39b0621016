"""The model as beam search sees it, with its attention recorded on the way.

Search records whatever `decode_step(..., need_weights=True)` returns, for every row of
every step, until the batch is done. A view decides what that is: everything (pictures of
one sentence) or one averaged cross-attention row (alignments for a whole file, where all
layers and heads of every beam would take hundreds of megabytes per batch). Both wrap the
one model that translates, so the weights are those of the forward pass that chose the
output; without a view, search runs the model's fast path and records nothing.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from nmt_cli.core.cache import DecoderCache
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.errors import NmtError


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


class _View:
    """Delegates the search interface to the model unchanged."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.cfg: ModelConfig = model.cfg  # search reads cfg.max_positions

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def new_cache(self) -> DecoderCache:
        return self.model.new_cache()

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.model.encode(src, src_mask)

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, Any]:
        lprobs, weights = self.model.decode_step(last_tokens, memory, src_mask, cache, need_weights)
        return lprobs, None if weights is None else self.keep(weights)

    def keep(self, weights: list[Tensor]) -> list[Tensor]:
        """What search records of one step's weights (see Transformer.decode_step)."""
        return weights


class EveryAttention(_View):
    """Records the encoder's self-attention of the batch (here, after `encode`) and lets
    search record every decoder layer's self- and cross-attention of every step."""

    def __init__(self, model: Transformer) -> None:
        super().__init__(model)
        self.encoder: list[Tensor] = []  # one (B, h, S, S) per encoder layer

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        memory, self.encoder = self.model.encode_with_attention(src, src_mask)
        return memory


class CrossAttentionOf(_View):
    """Lets search record one decoder layer's cross-attention, averaged over heads:
    one (rows, S) tensor per step."""

    def __init__(self, model: Transformer, layer: int) -> None:
        super().__init__(model)
        self.index = len(model.decoder) + layer  # decode_step lists self-attention first

    def keep(self, weights: list[Tensor]) -> list[Tensor]:
        return [weights[self.index].float().mean(1)[:, 0]]
