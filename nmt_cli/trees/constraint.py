"""Decoding that can only write well-formed trees: the parsing task's search constraint.

A parsing model writes a linearized tree (linearize.py: `(S (NP XX XX )NP (VP XX )VP )S`),
one target piece per token: `▁(NP` opens a bracket, `▁)NP` closes it, `▁XX` is a word's
slot. Nothing makes an unconstrained model's output a tree over the sentence: brackets may
not balance, and the slots may not match the words (most of a small model's outputs
needed `delinearize`'s repairs). Under `TreeState` (a core/constraints.py state) every
output is a linearization `delinearize` reads without a repair, with one slot per word of
the input sentence (its words, not its subword pieces):

- a bracket opens only while a word is left for it to hold; a slot comes only inside a
  bracket and while words are left;
- a bracket closes only with its own label, and only once it holds something (no empty
  brackets);
- no other piece is ever written (words, bare `(`, labels the vocabulary cannot close);
- EOS comes only when every bracket is closed and every word has its slot;
- a row never takes a token after which it could not finish within the tokens it has
  left: finishing needs a slot per word left, a closing bracket per open one, and a
  bracket to open and close when none is open and words are left.

Several top-level brackets may follow each other, as the linearization of a treebank
tree with several constituents under its root does.

The only module of the tree library that needs torch; scoring never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.core.beam_advance import Advance
from nmt_cli.core.vocab import EOS_ID, Vocab
from nmt_cli.trees.tree import PLACEHOLDER_TAG

OTHER, OPEN, CLOSE, SLOT, END = range(5)  # what each target piece is to a tree
WORD = "\u2581"  # SentencePiece's word-start mark: the tree's tokens are whole words


@dataclass(frozen=True)
class TreeVocabulary:
    """The target vocabulary as the tree constraint reads it: each piece's kind (OTHER,
    OPEN, CLOSE, SLOT, END), the label of each bracket piece, and the closing piece of
    each label."""

    kind: Tensor  # (V,) long
    label: Tensor  # (V,) long: the label's index for OPEN and CLOSE, else 0
    close_of: Tensor  # (labels,) long: the closing piece of each label

    @property
    def ids(self) -> Tensor:
        """The pieces a tree may hold, EOS among them: all that is ever unmasked."""
        return (self.kind != OTHER).nonzero().squeeze(1)

    @classmethod
    def of(cls, vocab: Vocab) -> TreeVocabulary | None:
        """The tree pieces of a parsing model's target vocabulary (None: it has no slot
        piece or no bracket that both opens and closes: not a tree vocabulary)."""
        return cls.of_pieces(vocab.pieces(range(len(vocab))))

    @classmethod
    def of_pieces(cls, pieces: Sequence[str]) -> TreeVocabulary | None:
        """The same from the vocabulary's pieces, in id order."""
        opens = {p[2:]: i for i, p in enumerate(pieces) if p.startswith(WORD + "(") and p[2:]}
        closes = {p[2:]: i for i, p in enumerate(pieces) if p.startswith(WORD + ")") and p[2:]}
        labels = sorted(set(opens) & set(closes))
        slots = [i for i, p in enumerate(pieces) if p == WORD + PLACEHOLDER_TAG]
        if not labels or not slots:
            return None
        kind = torch.full((len(pieces),), OTHER, dtype=torch.long)
        label = torch.zeros(len(pieces), dtype=torch.long)
        for index, name in enumerate(labels):
            kind[opens[name]], label[opens[name]] = OPEN, index
            kind[closes[name]], label[closes[name]] = CLOSE, index
        kind[slots] = SLOT
        kind[EOS_ID] = END
        close_of = torch.tensor([closes[name] for name in labels], dtype=torch.long)
        return cls(kind, label, close_of)

    def start(self, words: Sequence[int], device: torch.device | str = "cpu") -> TreeState:
        """The state of a batch of sentences of `words` words each, before any token."""
        return TreeState(self, torch.tensor(list(words), dtype=torch.long, device=device))


class TreeState:
    """Per row: the sentence's words, the slots written, the open brackets' labels (a
    stack), and whether the last token opened a bracket (which is then still empty)."""

    def __init__(self, vocab: TreeVocabulary, words: Tensor) -> None:
        device = words.device
        self.kind = vocab.kind.to(device)
        self.label = vocab.label.to(device)
        # The masks are computed over the tree's pieces only, a few dozen of thousands.
        self.ids = vocab.ids.to(device)
        self.id_kind = self.kind[self.ids]
        where = torch.full_like(self.kind, -1)
        where[self.ids] = torch.arange(self.ids.numel(), device=device)
        self.close_at = where[vocab.close_of.to(device)]  # each label's closing, in ids
        self.words = words
        rows = words.numel()
        self.used = torch.zeros(rows, dtype=torch.long, device=device)
        self.depth = torch.zeros(rows, dtype=torch.long, device=device)
        self.after_open = torch.zeros(rows, dtype=torch.bool, device=device)
        self.stack = torch.zeros(rows, 8, dtype=torch.long, device=device)

    def need(self) -> Tensor:
        """A slot per word left and a closing bracket per open one; with no bracket open
        and words left, a bracket to open and close."""
        left = self.words - self.used
        return left + self.depth + 2 * ((self.depth == 0) & (left > 0)).long()

    def mask(self, lprobs: Tensor, room: Tensor) -> None:
        left = self.words - self.used
        inside = self.depth > 0
        need = self.need()
        budget = room - 1  # what a row may still need after this token
        # Opening adds a closing bracket to the need, except the first one (already counted).
        open_ok = (left > 0) & (need + 2 * inside.long() - 1 <= budget)
        slot_ok = inside & (left > 0)  # a slot lowers the need by one: always fits
        last_close = (self.depth == 1) & (left > 0)  # then a new bracket is needed
        close_ok = inside & ~self.after_open & (need - 1 + 2 * last_close.long() <= budget)
        end_ok = ~inside & (left == 0)
        never = torch.zeros_like(open_ok)
        allowed_kinds = torch.stack([never, open_ok, never, slot_ok, end_ok], dim=1)
        allowed = allowed_kinds.index_select(1, self.id_kind)  # (rows, tree pieces)
        top = self.stack.gather(1, (self.depth - 1).clamp(min=0)[:, None]).squeeze(1)
        rows = torch.arange(lprobs.size(0), device=lprobs.device)
        allowed[rows, self.close_at[top]] = close_ok  # only the innermost bracket's label
        kept = lprobs.index_select(1, self.ids).masked_fill_(~allowed, -math.inf)
        lprobs.fill_(-math.inf)
        lprobs.index_copy_(1, self.ids, kept)

    def advance(self, tokens: Tensor) -> None:
        kind = self.kind[tokens]
        opens = kind == OPEN
        if bool(opens.any()):
            if int(self.depth.max()) >= self.stack.size(1):
                self.stack = torch.cat([self.stack, torch.zeros_like(self.stack)], dim=1)
            rows = opens.nonzero().squeeze(1)
            self.stack[rows, self.depth[rows]] = self.label[tokens[rows]]
        self.depth = (self.depth + opens.long() - (kind == CLOSE).long()).clamp(min=0)
        self.used = self.used + (kind == SLOT).long()
        self.after_open = opens

    def reorder(self, index: Tensor) -> None:
        self.words = self.words.index_select(0, index)
        self.used = self.used.index_select(0, index)
        self.depth = self.depth.index_select(0, index)
        self.after_open = self.after_open.index_select(0, index)
        self.stack = self.stack.index_select(0, index)

    def choose(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance | None:
        return None  # masking is all a tree needs: the model's advance chooses
