"""Decoding that can only write well-formed trees: the parsing task's search constraint.

A parsing model writes a linearized tree (linearize.py), brackets as whole target pieces
(`▁(NP` opens a bracket, `▁)NP` closes it) and, for each word of the sentence, its leaf:
the paper's `▁XX` slot, or (`leaves = "words"`) the word itself in its target pieces.
Nothing makes an unconstrained model's output a tree over the sentence: brackets may not
balance, and the leaves may not match the words. Under `TreeState` (a core/constraints.py
state) every output is a linearization `delinearize` reads without a repair, with one
leaf per word of the input sentence (its words, not its subword pieces):

- each row is given its sentence's leaves in order, a word's pieces each (`[XX]` for
  every word, or the word's own pieces); the next leaf is the only piece that is not a
  bracket the row may write, and once a word's first piece is written its others follow
  before anything else (no bracket opens or closes inside a word);
- a bracket opens only while a word is left for it to hold; a leaf comes only inside a
  bracket;
- a bracket closes only with its own label, and only once it holds something (no empty
  brackets);
- no other piece is ever written (other words, bare `(`, labels the vocabulary cannot
  close);
- EOS comes only when every bracket is closed and every word has its leaf;
- a row never takes a token after which it could not finish within the tokens it has
  left: finishing needs every leaf piece left, a closing bracket per open one, and a
  bracket to open and close when none is open and words are left.

Several top-level brackets may follow each other, as the linearization of a treebank
tree with several constituents under its root does.

The only module of the tree library that needs torch; scoring never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.core.beam_advance import Advance
from nmt_cli.core.vocab import EOS_ID, Vocab
from nmt_cli.errors import UsageError
from nmt_cli.trees.linearize import LEAVES
from nmt_cli.trees.tree import PLACEHOLDER_TAG

OTHER, OPEN, CLOSE, SLOT, END = range(5)  # what each target piece is to a tree
WORD = "\u2581"  # SentencePiece's word-start mark: the tree's tokens are whole words
Leaves = tuple[tuple[int, ...], ...]  # one sentence's leaves: each word's target pieces
TINY = 1e-30  # the least probability a leaf is given (never exactly 0: no log(0))


@dataclass(frozen=True)
class TreeVocabulary:
    """The target vocabulary as the tree constraint reads it: each piece's kind (OTHER,
    OPEN, CLOSE, SLOT, END), the label of each bracket piece, the closing piece of each
    label, and what a word's leaf is (the `XX` slot's id, or None: the word itself)."""

    kind: Tensor  # (V,) long
    label: Tensor  # (V,) long: the label's index for OPEN and CLOSE, else 0
    close_of: Tensor  # (labels,) long: the closing piece of each label
    slot: int | None  # the XX piece; None where every leaf is its word's own pieces
    brackets: dict[int, str]  # each bracket piece's token: "(NP", ")NP"

    @property
    def ids(self) -> Tensor:
        """The pieces a tree may hold besides the words, EOS among them."""
        return (self.kind != OTHER).nonzero().squeeze(1)

    @classmethod
    def of(cls, vocab: Vocab, leaves: str = "xx") -> TreeVocabulary | None:
        """The tree pieces of a parsing model's target vocabulary, its leaves `"xx"` (the
        paper's) or `"words"` (None: it has no bracket that both opens and closes, or, for
        XX leaves, no slot piece: not a tree vocabulary)."""
        return cls.of_pieces(vocab.pieces(range(len(vocab))), leaves)

    @classmethod
    def of_pieces(cls, pieces: Sequence[str], leaves: str = "xx") -> TreeVocabulary | None:
        """The same from the vocabulary's pieces, in id order."""
        if leaves not in LEAVES:
            raise ValueError(f"tree leaves must be one of {', '.join(LEAVES)}, got {leaves!r}")
        opens = {p[2:]: i for i, p in enumerate(pieces) if p.startswith(WORD + "(") and p[2:]}
        closes = {p[2:]: i for i, p in enumerate(pieces) if p.startswith(WORD + ")") and p[2:]}
        labels = sorted(set(opens) & set(closes))
        slots = [i for i, p in enumerate(pieces) if p == WORD + PLACEHOLDER_TAG]
        if not labels or (leaves == "xx" and not slots):
            return None
        kind = torch.full((len(pieces),), OTHER, dtype=torch.long)
        label = torch.zeros(len(pieces), dtype=torch.long)
        for index, name in enumerate(labels):
            kind[opens[name]], label[opens[name]] = OPEN, index
            kind[closes[name]], label[closes[name]] = CLOSE, index
        slot = slots[0] if leaves == "xx" else None
        if slot is not None:
            kind[slot] = SLOT
        kind[EOS_ID] = END
        close_of = torch.tensor([closes[name] for name in labels], dtype=torch.long)
        brackets = {opens[name]: "(" + name for name in labels}
        brackets.update({closes[name]: ")" + name for name in labels})
        return cls(kind, label, close_of, slot, brackets)

    def leaves(self, words: Sequence[str], encode: Callable[[str], list[int]]) -> Leaves:
        """A sentence's leaves: `XX` for each word, or each word's own target pieces
        (`encode`: one word -> its piece ids). A word whose pieces hold a bracket or EOS
        or that begins with a bracket cannot be a leaf (it would read back as a bracket): a
        UsageError."""
        if self.slot is not None:
            return tuple((self.slot,) for _ in words)
        out = []
        for word in words:
            pieces = tuple(encode(word))
            if word[0] in "()" or not pieces or bool((self.kind[list(pieces)] != OTHER).any()):
                raise UsageError(
                    f"the word {word!r} would read as a bracket of the tree; write brackets "
                    "as the treebank does (-LRB-, -RRB-)"
                )
            out.append(pieces)
        return tuple(out)

    def text(self, tokens: Sequence[int], words: Sequence[str], leaves: Leaves) -> str | None:
        """A word-leaved output as text, each leaf written as the sentence's own word (a
        word's pieces need not decode to it: characters the vocabulary lacks come back as
        SentencePiece's unknown mark); None where the leaves are XX, or where `tokens` do
        not hold `leaves` in order between brackets (the pieces' text is then the output)."""
        if self.slot is not None:
            return None
        out: list[str] = []
        used, at = 0, 0
        while at < len(tokens):
            token = tokens[at]
            if token in self.brackets:
                out.append(self.brackets[token])
                at += 1
                continue
            if used == len(leaves) or tuple(tokens[at : at + len(leaves[used])]) != leaves[used]:
                return None
            out.append(words[used])
            at += len(leaves[used])
            used += 1
        return " ".join(out)

    def start(self, leaves: Sequence[Leaves], device: torch.device | str = "cpu") -> TreeState:
        """The state of a batch of sentences given their leaves (`leaves`), before any token."""
        return TreeState(self, leaves, torch.device(device))


class TreeState:
    """Per row: its sentence, the next leaf piece to write, the open brackets' labels (a
    stack), and whether the last token opened a bracket (which is then still empty).

    Rows index their sentence's leaves (`sentence`), so that reordering moves one number
    a row, not its sentence's pieces."""

    def __init__(self, vocab: TreeVocabulary, leaves: Sequence[Leaves], device: torch.device):
        self.kind = vocab.kind.to(device)
        self.label = vocab.label.to(device)
        # The masks are computed over the tree's pieces only, a few dozen of thousands.
        self.ids = vocab.ids.to(device)
        self.id_kind = self.kind[self.ids]
        where = torch.full_like(self.kind, -1)
        where[self.ids] = torch.arange(self.ids.numel(), device=device)
        self.close_at = where[vocab.close_of.to(device)]  # each label's closing, in ids
        flat = [[p for word in words for p in word] for words in leaves]
        width = max((len(f) for f in flat), default=0) + 1  # a pad after the last piece
        rows = len(flat)
        # Each sentence's leaf pieces in order, and which of them begin a word.
        self.pieces = torch.zeros(rows, width, dtype=torch.long)
        self.first = torch.zeros(rows, width, dtype=torch.bool)
        for row, words in enumerate(leaves):
            at = 0
            for word in words:
                self.pieces[row, at : at + len(word)] = torch.tensor(word)
                self.first[row, at] = True
                at += len(word)
        self.pieces, self.first = self.pieces.to(device), self.first.to(device)
        self.total = torch.tensor([len(f) for f in flat], dtype=torch.long, device=device)
        self.sentence = torch.arange(rows, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.depth = torch.zeros(rows, dtype=torch.long, device=device)
        self.after_open = torch.zeros(rows, dtype=torch.bool, device=device)
        self.stack = torch.zeros(rows, 8, dtype=torch.long, device=device)

    def _next(self) -> tuple[Tensor, Tensor]:
        """Each row's next leaf piece (a pad when none is left), and whether it continues
        a word already begun."""
        at = (self.sentence, self.pos)
        return self.pieces[at], ~self.first[at] & (self.pos < self.total[self.sentence])

    def need(self) -> Tensor:
        """Every leaf piece left and a closing bracket per open one; with no bracket open
        and words left, a bracket to open and close."""
        left = self.total[self.sentence] - self.pos
        return left + self.depth + 2 * ((self.depth == 0) & (left > 0)).long()

    def mask(self, lprobs: Tensor, room: Tensor) -> None:
        left = self.total[self.sentence] - self.pos
        piece, mid_word = self._next()
        between = ~mid_word  # brackets and EOS only between words
        inside = self.depth > 0
        need = self.need()
        budget = room - 1  # what a row may still need after this token
        # Opening adds a closing bracket to the need, except the first one (already counted).
        open_ok = between & (left > 0) & (need + 2 * inside.long() - 1 <= budget)
        leaf_ok = inside & (left > 0)  # a leaf piece lowers the need by one: always fits
        last_close = (self.depth == 1) & (left > 0)  # then a new bracket is needed
        close_ok = between & inside & ~self.after_open
        close_ok &= need - 1 + 2 * last_close.long() <= budget
        end_ok = ~inside & (left == 0)
        never = torch.zeros_like(open_ok)
        allowed_kinds = torch.stack([never, open_ok, never, never, end_ok], dim=1)
        allowed = allowed_kinds.index_select(1, self.id_kind)  # (rows, tree pieces)
        top = self.stack.gather(1, (self.depth - 1).clamp(min=0)[:, None]).squeeze(1)
        rows = torch.arange(lprobs.size(0), device=lprobs.device)
        allowed[rows, self.close_at[top]] = close_ok  # only the innermost bracket's label
        kept = lprobs.index_select(1, self.ids)
        # A leaf scores what the model gives to writing a leaf at all: the mass of every
        # piece but brackets and EOS, whichever word it would have written (the words are
        # given; what is searched is the tree). The rest of a begun word is free.
        structure = kept.masked_fill(self.id_kind == SLOT, -math.inf).exp().sum(1)
        leaf = (1 - structure).clamp(min=TINY).log().masked_fill_(mid_word, 0.0)
        leaf = leaf.masked_fill_(~leaf_ok, -math.inf)[:, None]
        kept.masked_fill_(~allowed, -math.inf)
        lprobs.fill_(-math.inf)
        lprobs.index_copy_(1, self.ids, kept)
        lprobs.scatter_(1, piece[:, None], leaf)  # the next leaf piece, where it may come

    def advance(self, tokens: Tensor) -> None:
        piece, _ = self._next()
        kind = self.kind[tokens]
        opens = kind == OPEN
        if bool(opens.any()):
            if int(self.depth.max()) >= self.stack.size(1):
                self.stack = torch.cat([self.stack, torch.zeros_like(self.stack)], dim=1)
            rows = opens.nonzero().squeeze(1)
            self.stack[rows, self.depth[rows]] = self.label[tokens[rows]]
        self.depth = (self.depth + opens.long() - (kind == CLOSE).long()).clamp(min=0)
        left = self.pos < self.total[self.sentence]
        self.pos = self.pos + ((tokens == piece) & left).long()
        self.after_open = opens

    def reorder(self, index: Tensor) -> None:
        self.sentence = self.sentence.index_select(0, index)
        self.pos = self.pos.index_select(0, index)
        self.depth = self.depth.index_select(0, index)
        self.after_open = self.after_open.index_select(0, index)
        self.stack = self.stack.index_select(0, index)

    def choose(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance | None:
        return None  # masking is all a tree needs: the model's advance chooses
