"""From subword attention to words: merging SentencePiece pieces, and hard alignments.

SentencePiece marks the first piece of every word with U+2581 ("▁"), so the words of a
tokenized sentence are recovered from its pieces alone: they are the whitespace-separated
tokens of the (normalized) text. subword-nmt's BPE (fairseq's models, imported) marks the
other way round, every piece but a word's last ending in "@@", and its words are the Moses
tokens. A sentence whose pieces carry no "▁" at all is BPE (SentencePiece marks at least
its first word). Special tokens (`<s>`, `</s>`) are words of their own.

Merging an attention matrix (rows attend, columns are attended to) into words follows
Clark et al. (2019, "What does BERT look at?"): attention *to* a word is the sum of the
attention to its pieces (so every row still sums to one) and attention *from* a word is the
mean over its pieces' rows.

A hard alignment links every target word to the source word its cross-attention weighs
most (as fairseq's `--print-alignment`), end-of-sentence tokens left out, written as
Moses / fast_align `i-j` pairs (0-based source word i, target word j).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WORD_START = "\u2581"
BPE_CONTINUES = "@@"  # subword-nmt: this piece and the next are one word
SPECIAL = ("<s>", "</s>", "<pad>", "<unk>")

# The sentence every legend carries when pieces were merged into words.
MERGE_NOTE = "words: attention to a word sums its pieces, attention from a word averages them"


def _is_bpe(pieces: Sequence[str]) -> bool:
    return not any(piece.startswith(WORD_START) for piece in pieces)


def word_groups(pieces: Sequence[str]) -> list[int]:
    """The word index of every piece: a new word at each piece that starts with "▁" (BPE:
    after each piece that does not end with "@@"), at each special token, and right
    after a special token."""
    bpe = _is_bpe(pieces)
    groups: list[int] = []
    word = -1
    after_special = continues = True
    for piece in pieces:
        special = piece in SPECIAL
        starts = not continues if bpe else piece.startswith(WORD_START)
        if special or after_special or starts:
            word += 1
        groups.append(word)
        after_special, continues = special, piece.endswith(BPE_CONTINUES)
    return groups


def word_labels(pieces: Sequence[str]) -> list[str]:
    """The words themselves, pieces joined without their "▁" (or "@@") markers."""
    marker = BPE_CONTINUES if _is_bpe(pieces) else WORD_START
    words: list[str] = []
    for piece, group in zip(pieces, word_groups(pieces), strict=True):
        text = piece if piece in SPECIAL else piece.replace(marker, "")
        if group == len(words):
            words.append(text)
        else:
            words[group] += text
    return words


def merge_columns(weights: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """(..., cols) -> (..., words): attention to a word is the sum over its pieces."""
    n = max(groups) + 1
    out = np.zeros((*weights.shape[:-1], n), dtype=weights.dtype)
    for col, group in enumerate(groups):
        out[..., group] += weights[..., col]
    return out


def merge_rows(weights: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """(..., rows, cols) -> (..., words, cols): attention from a word is the mean of its
    pieces' rows."""
    n = max(groups) + 1
    sizes = np.bincount(np.asarray(groups), minlength=n).astype(weights.dtype)
    out = np.zeros((*weights.shape[:-2], n, weights.shape[-1]), dtype=weights.dtype)
    for row, group in enumerate(groups):
        out[..., group, :] += weights[..., row, :]
    return out / sizes[:, None]


def merge_words(
    weights: np.ndarray, row_pieces: Sequence[str], col_pieces: Sequence[str]
) -> np.ndarray:
    """(..., rows, cols) over pieces -> (..., row words, column words)."""
    return merge_rows(merge_columns(weights, word_groups(col_pieces)), word_groups(row_pieces))


def hard_alignment(
    cross: np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> list[tuple[int, int]]:
    """(source word, target word) pairs from one cross-attention matrix.

    `cross` is (T, S): one row per generated piece (the row of `</s>` may be included),
    one column per source piece (`</s>` included). Each target word is linked to the
    source word with the largest merged weight; sorted by source, then target word.
    """
    tgt = [p for p in tgt_pieces if p != "</s>"]
    src = [p for p in src_pieces if p != "</s>"]
    if not tgt or not src:
        return []
    words = merge_words(cross[: len(tgt), : len(src)], tgt, src)
    best = words.argmax(axis=1)
    return sorted((int(i), j) for j, i in enumerate(best))


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """Moses / fast_align: "0-0 1-2 2-1"."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
