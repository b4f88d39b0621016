"""Source attention of finished translations, recomputed by teacher forcing.

Search keeps no attention weights: tracking them through every beam reorder would cost
every user memory and time for what few ask for. Asking for them instead runs the
decoder once more over the final hypotheses with the explicit attention path. The model
is deterministic in eval mode, so these are exactly the weights the decoder computed
while producing those tokens.

The weights are those of the last decoder layer's cross-attention, averaged over heads
(the usual choice for alignments, as in fairseq's `--print-alignment` default layer) and,
for an ensemble, over members.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import BOS_ID, PAD_ID


@torch.inference_mode()
def source_attention(
    models: Sequence[Transformer], src: Tensor, targets: Sequence[Sequence[int]]
) -> list[Tensor]:
    """src: (N, S) right-padded rows, each ids + [EOS]; targets: N output id lists without
    BOS/EOS. Returns per row a float32 (T + 1, S_n) matrix: one row per output token and
    the final EOS, one column per real source token (its EOS included); rows sum to 1."""
    n = src.size(0)
    width = max((len(t) for t in targets), default=0) + 1
    tgt_in = torch.full((n, width), PAD_ID, dtype=torch.long, device=src.device)
    for row, tokens in enumerate(targets):
        tgt_in[row, : len(tokens) + 1] = torch.tensor([BOS_ID, *tokens], dtype=torch.long)
    total: Tensor | None = None
    for model in models:
        src_mask = model.source_mask(src)
        memory = model.encode(src, src_mask)
        out = model.decode(tgt_in, memory, src_mask, need_weights=True)
        assert out.cross_attention is not None
        weights = out.cross_attention[-1].float().mean(1)  # (N, T, S)
        total = weights if total is None else total + weights
    assert total is not None
    total = total / len(models)
    src_len = (src != PAD_ID).sum(1).tolist()
    return [
        total[row, : len(tokens) + 1, : src_len[row]].cpu() for row, tokens in enumerate(targets)
    ]
