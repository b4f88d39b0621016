"""Several Transformers decoded as one model: the mean of their log-probabilities.

Sockeye's design: an ensemble implements the same incremental-decoding interface as one
model (`core.searchable.Searchable`: source_mask, encode, new_cache, decode_step, the cache's
reorder, max_positions), so greedy and beam search, batching, caching and n-best work
unchanged and have no ensemble case to get wrong.

At every step each member scores the next token from its own encoder output and its own
key/value cache, and the ensemble's score of a token is the average of the members'
log-probabilities (log-linear combination, Sockeye's `log_linear`; fairseq averages the
same way). A hypothesis' log-probability is therefore the average of the members'
teacher-forced log-probabilities of it. Members may differ in architecture (layers,
widths, positions) but must share the vocabularies: `check_same_vocabularies` says which
one differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from torch import Tensor, nn

from nmt_cli.core.beam_advance import Advance, decode_then_advance
from nmt_cli.core.cache import StepCache
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.open_sentence import search_loop_only
from nmt_cli.core.searchable import Searchable
from nmt_cli.core.vocab import Vocab, VocabPair
from nmt_cli.errors import NmtError


class Member(Searchable, Protocol):
    """What an ensemble needs of a member: a Transformer, or a backend's wrapper of one
    (nmt_cli/backends/cpu's CpuDecoder), with search's interface (narrowed to what a
    Transformer's encoder, cache and positions are) and the configuration."""

    @property
    def cfg(self) -> ModelConfig: ...

    @property
    def max_positions(self) -> int: ...

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor: ...

    def encode_with_attention(
        self, src: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]: ...

    def new_cache(self) -> StepCache: ...

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: Any,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]: ...


@dataclass
class EnsembleCache:
    """One cache per member, reordered together."""

    members: list[StepCache]

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        for cache in self.members:
            cache.reorder(index, cross)

    def reserve(self, steps: int) -> None:
        for cache in self.members:
            cache.reserve(steps)


class Ensemble(nn.Module):
    """Members in an nn.ModuleList, so `.to()`, `.eval()` and `.parameters()` reach all."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        pad_ids = {cast(Member, m).cfg.pad_id for m in members}
        if len(pad_ids) > 1:
            raise ValueError(f"ensemble members disagree on the padding id: {sorted(pad_ids)}")
        self.members = nn.ModuleList(members)

    def models(self) -> list[Member]:
        return [cast(Member, m) for m in self.members]

    @property
    def max_positions(self) -> int:
        """The shortest member's positions: every member must reach every step."""
        return min(m.max_positions for m in self.models())

    def source_mask(self, src: Tensor) -> Tensor:
        # Members share the padding id (checked above), so their masks are one mask.
        return self.models()[0].source_mask(src)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> list[Tensor]:
        if src_mask is None:
            src_mask = self.source_mask(src)
        return [m.encode(src, src_mask) for m in self.models()]

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([m.new_cache() for m in self.models()])

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        """The first member's: members are built alike, so all would choose the same."""
        return self.models()[0].advance(lprobs, cum, history, k)

    # A whole beam step: the reference, since the members' mean is of their log-probabilities.
    decode_advance = decode_then_advance
    finish_sentence = search_loop_only

    def slots(self, open_sentences: int, beam: int) -> int:
        """The most any member keeps, so no member sees a batch shape it would avoid."""
        return max(m.slots(open_sentences, beam) for m in self.models())

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: list[Tensor],
        src_mask: Tensor,
        cache: EnsembleCache,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """(B,) newest tokens -> the members' mean log-probabilities (B, V), in float32.

        With `need_weights`, also the members' mean attention weights, tensor by tensor
        (Transformer.decode_step's list; the members must share decoder layers and heads,
        which engines/translate/views.decoder_layers checks before recording)."""
        total: Tensor | None = None
        weights: list[Tensor] | None = None
        for model, mem, member_cache in zip(self.models(), memory, cache.members, strict=True):
            lprobs, w = model.decode_step(last_tokens, mem, src_mask, member_cache, need_weights)
            total = lprobs if total is None else total + lprobs
            if w is not None:
                w = [x.float() for x in w]
                weights = w if weights is None else [a + b for a, b in zip(weights, w, strict=True)]
        assert total is not None
        n = len(self.members)
        return total / n, None if weights is None else [w / n for w in weights]


def members(model: Member | Ensemble) -> list[Member]:
    """The single models behind a searchable model: itself, or an ensemble's members."""
    return model.models() if isinstance(model, Ensemble) else [model]


def check_same_vocabularies(vocabs: Sequence[VocabPair], names: Sequence[str]) -> None:
    """Refuse an ensemble whose members would read or write different token ids.

    Averaging log-probabilities is only meaningful when id i is the same piece in every
    member, on both sides; the error names the first file that differs, the side, and how.
    """
    first, first_name = vocabs[0], names[0]
    for vocab, name in zip(vocabs[1:], names[1:], strict=True):
        for side in ("src", "tgt"):
            difference = _vocab_difference(getattr(first, side), getattr(vocab, side))
            if difference:
                label = "source" if side == "src" else "target"
                raise NmtError(
                    f"{name}: cannot ensemble with {first_name}: the {label} vocabularies "
                    f"differ ({difference}); ensembles need models trained on one vocabulary"
                )


def _vocab_difference(a: Vocab, b: Vocab) -> str:
    if a.model_proto == b.model_proto:
        return ""
    if len(a) != len(b):
        return f"{len(a):,} vs {len(b):,} pieces"
    for i in range(len(a)):
        piece_a, piece_b = a.pieces([i])[0], b.pieces([i])[0]
        if piece_a != piece_b:
            return f"piece {i} is {piece_a!r} vs {piece_b!r}"
    return ""  # same pieces in the same order: only settings that do not change ids differ
