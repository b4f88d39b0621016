"""Beam search records attention: each hypothesis carries the weights of the very steps that
produced it, equal to a teacher-forced pass over its tokens, without changing the output."""

from __future__ import annotations

import pytest
import torch

from nmt_cli.core.search import beam_search
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID

pytestmark = pytest.mark.usefixtures("one_thread")


def _sources() -> torch.Tensor:
    """Six sentences of different lengths: some finish early, so the batch shrinks."""
    g = torch.Generator().manual_seed(3)
    src = torch.zeros(6, 10, dtype=torch.long)
    for i, n in enumerate((3, 8, 5, 2, 7, 4)):
        src[i, :n] = torch.randint(4, 40, (n,), generator=g)
        src[i, n] = EOS_ID
    return src


@pytest.mark.parametrize("beam", [1, 3])
def test_recorded_weights_are_those_of_a_teacher_forced_pass(
    tiny_model: Transformer, beam: int
) -> None:
    src = _sources()
    plain = beam_search(tiny_model, src, beam_size=beam, max_len_a=0.0, max_len_b=9, nbest=beam)
    recorded = beam_search(
        tiny_model, src, beam_size=beam, max_len_a=0.0, max_len_b=9, nbest=beam, need_weights=True
    )
    assert [[h.tokens for h in r] for r in recorded] == [[h.tokens for h in r] for r in plain]
    assert all(h.attention is None for r in plain for h in r)
    layers = len(tiny_model.decoder)
    for i, hyps in enumerate(recorded):
        for hyp in hyps:
            assert hyp.attention is not None and len(hyp.attention) == len(hyp.tokens) + 1
            row = src[i : i + 1]
            mask = tiny_model.source_mask(row)
            tgt = torch.tensor([[BOS_ID, *hyp.tokens]])
            with torch.inference_mode():
                full = tiny_model.decode(tgt, tiny_model.encode(row, mask), mask, need_weights=True)
            assert full.self_attention is not None and full.cross_attention is not None
            for t, step in enumerate(hyp.attention):
                assert len(step) == 2 * layers
                for layer in range(layers):
                    own, cross = step[layer], step[layers + layer]
                    assert own.shape == (4, 1, t + 1)
                    torch.testing.assert_close(
                        own[:, 0], full.self_attention[layer][0, :, t, : t + 1], atol=1e-5, rtol=0
                    )
                    torch.testing.assert_close(
                        cross[:, 0], full.cross_attention[layer][0, :, t], atol=1e-5, rtol=0
                    )


def test_encoder_weights_come_with_the_same_output(tiny_model: Transformer) -> None:
    src = _sources()
    mask = tiny_model.source_mask(src)
    memory, weights = tiny_model.encode_with_attention(src, mask)
    torch.testing.assert_close(memory, tiny_model.encode(src, mask), atol=1e-5, rtol=0)
    assert len(weights) == len(tiny_model.encoder)
    assert weights[0].shape == (6, 4, 10, 10)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(6, 4, 10))
    assert weights[0][3, :, :, 3:].abs().max().item() == 0.0  # padding gets no attention
