"""Source attention attached to translated hypotheses, with the pieces it aligns.

The weights come from core/attention.py (teacher forcing the final hypotheses); this
module labels their rows and columns with subword pieces, so a caller can read or plot
an alignment without the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from nmt_cli.core.attention import source_attention
from nmt_cli.core.search import Hypothesis
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import EOS_ID, PAD_ID, VocabPair


@dataclass(frozen=True)
class SourceAttention:
    """weights[i][j]: how much output piece i attended to source piece j (rows sum to 1)."""

    source: list[str]  # source pieces, then "</s>"
    target: list[str]  # output pieces, then "</s>"
    weights: list[list[float]]


def hypothesis_attention(
    models: Sequence[Transformer],
    vocab: VocabPair,
    src: Tensor,
    found: Sequence[Sequence[Hypothesis]],
) -> list[list[SourceAttention]]:
    """Per source row of `src`, the attention of each of its hypotheses."""
    rows = [(n, hyp) for n, hyps in enumerate(found) for hyp in hyps]
    if not rows:
        return [[] for _ in found]
    index = [n for n, _ in rows]
    matrices = source_attention(models, src[index], [hyp.tokens for _, hyp in rows])
    out: list[list[SourceAttention]] = [[] for _ in found]
    for (n, hyp), matrix in zip(rows, matrices, strict=True):
        src_ids = [i for i in src[n].tolist() if i != PAD_ID]
        out[n].append(
            SourceAttention(
                source=vocab.src.pieces(src_ids),
                target=vocab.tgt.pieces([*hyp.tokens, EOS_ID]),
                weights=matrix.tolist(),
            )
        )
    return out
