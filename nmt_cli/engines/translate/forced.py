"""Translations that start with a given prefix and contain given phrases (terminology).

fairseq's `--constraints` and Sockeye's lexical constraints, as a search constraint
(core/constraints.py). Per sentence, target token ids: a prefix the output must start
with, and phrases it must contain, each as a whole, anywhere after the prefix.

How `PhraseState` keeps them:

- the prefix is forced: while a row is inside it, its next piece is the only token it may
  take;
- a phrase starts when a row writes its first piece (the model chose it, or the row had
  no other choice left), and is then forced to its end: a phrase once begun is always
  finished, never abandoned half-way (the simple, safe rule: hypotheses never need to
  track partial matches that may fail);
- EOS is banned until every phrase is written, and a row whose remaining room (tokens
  before the length limit) equals what it still needs may only start a phrase;
- phrases already inside the prefix count as written; when two phrases begin with the
  same piece, the first one listed is the one started.

Beam search keeps hypotheses at every stage of meeting the phrases side by side with
dynamic beam allocation (Post & Vilar 2018, "Fast Lexically Constrained Decoding with
Dynamic Beam Allocation"): the candidates of a step are the K best, each row's best, and
each row's tokens that advance a phrase; they are grouped into banks by the phrase
tokens written so far, each bank gets K / (phrase tokens + 1) of the K places, the best
first, and places a bank cannot fill go to the best candidates left. Without it the beam
fills with hypotheses that postpone the phrases, which then come last, at the length
limit. With fewer places than banks (beam 1) no bank gets a place: beam 1 is greedy
search under the same masks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.core.beam_advance import Advance, mask_specials, with_ends
from nmt_cli.core.vocab import EOS_ID, PAD_ID


@dataclass(frozen=True)
class ForcedIds:
    """What one sentence's output must hold, in target token ids."""

    prefix: tuple[int, ...] = ()
    phrases: tuple[tuple[int, ...], ...] = ()

    @property
    def tokens(self) -> int:
        """The most tokens the prefix and phrases take (phrases inside the prefix too)."""
        return len(self.prefix) + sum(len(p) for p in self.phrases)


def _padded(rows: Sequence[Sequence[int]], width: int, device: torch.device | str) -> Tensor:
    out = torch.full((len(rows), max(width, 1)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


def _contains(whole: Sequence[int], part: Sequence[int]) -> bool:
    return any(tuple(whole[i : i + len(part)]) == tuple(part) for i in range(len(whole)))


class PhraseState:
    """Per row: its sentence, how far into the prefix it is, which phrases are written,
    the phrase being written (-1: none) and how far, and the phrase tokens written."""

    def __init__(self, forced: Sequence[ForcedIds], device: torch.device | str = "cpu") -> None:
        n = len(forced)
        width = max((len(f.phrases) for f in forced), default=0)
        longest = max((len(p) for f in forced for p in f.phrases), default=0)
        self.prefix = _padded(
            [f.prefix for f in forced], max(len(f.prefix) for f in forced), device
        )
        self.prefix_len = torch.tensor([len(f.prefix) for f in forced], device=device)
        phrases = torch.full((n, max(width, 1), max(longest, 1)), PAD_ID, dtype=torch.long)
        lengths = torch.zeros(n, max(width, 1), dtype=torch.long)
        met = torch.ones(n, max(width, 1), dtype=torch.bool)  # absent phrases count as met
        for i, f in enumerate(forced):
            for c, phrase in enumerate(f.phrases):
                phrases[i, c, : len(phrase)] = torch.tensor(phrase)
                lengths[i, c] = len(phrase)
                met[i, c] = _contains(f.prefix, phrase)
        self.phrases, self.lengths = phrases.to(device), lengths.to(device)
        self.total = (self.lengths * ~met.to(device)).sum(1)  # phrase tokens to write
        self.has_phrases = bool((self.total > 0).any())
        self.sent = torch.arange(n, device=device)
        self.ppos = torch.zeros(n, dtype=torch.long, device=device)
        self.met = met.to(device)
        self.active = torch.full((n,), -1, dtype=torch.long, device=device)
        self.pos = torch.zeros(n, dtype=torch.long, device=device)
        self.done = torch.zeros(n, dtype=torch.long, device=device)

    def need(self) -> Tensor:
        prefix_left = (self.prefix_len[self.sent] - self.ppos).clamp(min=0)
        return prefix_left + self.total[self.sent] - self.done

    def _in_prefix(self) -> Tensor:
        return self.ppos < self.prefix_len[self.sent]

    def _forced(self) -> Tensor:
        """(rows,) the one token each row must take next, or -1 where it is free."""
        in_prefix = self._in_prefix()
        last = self.prefix.size(1) - 1
        from_prefix = self.prefix[self.sent, self.ppos.clamp(max=last)]
        at = self.pos.clamp(max=self.phrases.size(2) - 1)
        from_phrase = self.phrases[self.sent, self.active.clamp(min=0), at]
        free = torch.full_like(from_prefix, -1)
        return torch.where(in_prefix, from_prefix, torch.where(self.active >= 0, from_phrase, free))

    def _starts(self) -> Tensor:
        """(rows, C) the first piece of each phrase a free row may start, else -1."""
        free = ~self._in_prefix() & (self.active < 0)
        ok = free[:, None] & ~self.met
        return self.phrases[self.sent, :, 0].masked_fill(~ok, -1)

    def mask(self, lprobs: Tensor, room: Tensor) -> None:
        forced = self._forced()
        need = self.need()
        rows = (forced >= 0).nonzero().squeeze(1)
        if rows.numel():
            keep = lprobs[rows, forced[rows]]
            lprobs[rows] = -math.inf
            lprobs[rows, forced[rows]] = keep
        free = forced < 0
        lprobs[:, EOS_ID].masked_fill_(free & (need > 0), -math.inf)
        tight = (free & (need >= room)).nonzero().squeeze(1)
        if tight.numel():  # no room left for anything but starting a phrase
            starts = self._starts()[tight]
            allowed = torch.zeros(tight.numel(), lprobs.size(1), device=lprobs.device)
            allowed.scatter_add_(1, starts.clamp(min=0), (starts >= 0).float())
            lprobs[tight] = lprobs[tight].masked_fill(allowed == 0, -math.inf)

    def advance(self, tokens: Tensor) -> None:
        starts = self._starts()
        in_prefix = self._in_prefix()
        self.ppos = self.ppos + in_prefix.long()
        going = (self.active >= 0) & ~in_prefix
        self.pos = self.pos + going.long()
        self.done = self.done + going.long()
        lengths = self.lengths[self.sent]
        length = lengths.gather(1, self.active.clamp(min=0)[:, None]).squeeze(1)
        self._written(going & (self.pos >= length), self.active)
        match = starts == tokens[:, None]
        begun = match.any(1)
        if bool(begun.any()):
            which = match.long().argmax(1)  # the first phrase listed that begins so
            self.done = self.done + begun.long()
            single = begun & (lengths.gather(1, which[:, None]).squeeze(1) == 1)
            self._written(single, which)
            self.active = torch.where(begun & ~single, which, self.active)
            self.pos = torch.where(begun & ~single, torch.ones_like(self.pos), self.pos)

    def _written(self, rows: Tensor, phrase: Tensor) -> None:
        """`rows` have just written the last piece of their `phrase`."""
        index = rows.nonzero().squeeze(1)
        if index.numel():
            self.met[index, phrase[index]] = True
            self.active = self.active.masked_fill(rows, -1)
            self.pos = self.pos.masked_fill(rows, 0)

    def reorder(self, index: Tensor) -> None:
        self.sent = self.sent.index_select(0, index)
        self.ppos = self.ppos.index_select(0, index)
        self.met = self.met.index_select(0, index)
        self.active = self.active.index_select(0, index)
        self.pos = self.pos.index_select(0, index)
        self.done = self.done.index_select(0, index)

    def choose(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance | None:
        """Dynamic beam allocation (module docstring); None without phrases."""
        if not self.has_phrases:
            return None
        mask_specials(lprobs)
        rows, vocab = lprobs.size(0), lprobs.size(1)
        n = rows // k
        scores = lprobs.add_(cum.view(-1, 1))
        advancing = torch.cat([self._forced_in_phrase()[:, None], self._starts()], dim=1)
        top, flat = scores.view(n, -1).topk(k, dim=1)
        top_row = (
            torch.div(flat, vocab, rounding_mode="floor")
            + torch.arange(n, device=flat.device)[:, None] * k
        )
        best, best_tok = scores.max(dim=1)
        every = torch.arange(rows, device=scores.device)
        adv_score = scores.gather(1, advancing.clamp(min=0)).masked_fill(advancing < 0, -math.inf)
        width = advancing.size(1)
        cand_row = torch.cat(
            [top_row, every.view(n, k), every[:, None].expand(rows, width).reshape(n, -1)], 1
        )
        cand_tok = torch.cat(
            [flat.remainder(vocab), best_tok.view(n, k), advancing.clamp(min=0).view(n, -1)], 1
        )
        cand_score = torch.cat([top, best.view(n, k), adv_score.view(n, -1)], 1)
        # Each (row, token) once.
        key, order = (cand_row * vocab + cand_tok).sort(dim=1)
        cand_row, cand_tok = cand_row.gather(1, order), cand_tok.gather(1, order)
        cand_score = cand_score.gather(1, order)
        repeated = torch.zeros_like(key, dtype=torch.bool)
        repeated[:, 1:] = key[:, 1:] == key[:, :-1]
        cand_score = cand_score.masked_fill(repeated, -math.inf)
        # Banks: phrase tokens written after this token.
        steps = (advancing[cand_row] == cand_tok[..., None]).any(-1)
        bank = self.done[cand_row] + steps.long()
        cand_score, order = cand_score.sort(dim=1, descending=True)
        cand_row, cand_tok, bank = (
            cand_row.gather(1, order),
            cand_tok.gather(1, order),
            bank.gather(1, order),
        )
        places = k // (self.total[self.sent.view(n, k)[:, 0]] + 1)  # (n,) per bank
        in_bank = F.one_hot(bank, int(bank.max()) + 1)
        rank = (in_bank.cumsum(1) * in_bank).sum(-1) - 1  # place in its bank, best first
        placed = (rank < places[:, None]) & (cand_score > -math.inf)
        # The placed ones first, then the best of the rest (stable: by score within each).
        pick = placed.long().sort(dim=1, descending=True, stable=True).indices[:, :k]
        top_lp = cand_score.gather(1, pick)
        top_lp, best_first = top_lp.sort(dim=1, descending=True)
        pick = pick.gather(1, best_first)
        tokens, origin = cand_tok.gather(1, pick), cand_row.gather(1, pick).view(-1)
        history = torch.cat([history.index_select(0, origin), tokens.view(-1, 1)], dim=1)
        return with_ends(top_lp, tokens, origin, history)

    def _forced_in_phrase(self) -> Tensor:
        """(rows,) the next piece of the phrase a row is writing, or -1."""
        going = (self.active >= 0) & ~self._in_prefix()
        at = self.pos.clamp(max=self.phrases.size(2) - 1)
        piece = self.phrases[self.sent, self.active.clamp(min=0), at]
        return piece.masked_fill(~going, -1)
