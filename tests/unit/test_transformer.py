"""The core model: masking, incremental decoding, positions, tying, parameter counts."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nmt_cli.core.parameters import count_parameters
from nmt_cli.core.transformer import ModelConfig, Transformer, sinusoidal_positions


def _batch(vocab: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (3, 9), generator=g)
    src[1, 6:] = 0  # right padding
    src[2, 4:] = 0
    tgt = torch.randint(4, vocab, (3, 7), generator=g)
    return src, tgt


def test_output_shape(tiny_model: Transformer) -> None:
    src, tgt = _batch()
    assert tiny_model(src, tgt).shape == (3, 7, 40)


def test_future_target_tokens_never_change_past_outputs(tiny_model: Transformer) -> None:
    src, tgt = _batch()
    base = tiny_model(src, tgt)
    for i in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, i + 1 :] = torch.randint(4, 40, changed[:, i + 1 :].shape)
        out = tiny_model(src, changed)
        torch.testing.assert_close(out[:, : i + 1], base[:, : i + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, i + 1 :], base[:, i + 1 :])


def test_padded_source_tokens_never_change_any_output(tiny_model: Transformer) -> None:
    src, tgt = _batch()
    base = tiny_model(src, tgt)
    # Fill padding positions with real ids: outputs must not move, the mask hides them.
    noisy = src.clone()
    noisy[src == 0] = 7
    mask = tiny_model.source_mask(src)
    memory = tiny_model.encode(noisy, mask)
    out = tiny_model.logits(tiny_model.decode(tgt, memory, mask).hidden)
    torch.testing.assert_close(out, base, rtol=0, atol=1e-6)
    # A shorter, unpadded copy of row 2 gives the same outputs as its padded form.
    alone = tiny_model(src[2:3, :4], tgt[2:3])
    torch.testing.assert_close(alone, base[2:3], rtol=0, atol=1e-5)


@pytest.mark.parametrize("d_k", [None, 4])
def test_incremental_decoding_equals_full_forward(
    tiny_config: ModelConfig, d_k: int | None
) -> None:
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(tiny_config, d_k=d_k)).eval()
    src, tgt = _batch()
    full = model(src, tgt).log_softmax(-1)
    mask = model.source_mask(src)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    steps = [model.decode_step(tgt[:, t], memory, mask, cache)[0] for t in range(tgt.size(1))]
    assert (torch.stack(steps, 1) - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("inference", [True, False], ids=["inference", "autograd"])
def test_incremental_decoding_after_cache_reorder(tiny_model: Transformer, inference: bool) -> None:
    """Search's reorders (applied as the next position is appended, two in a row
    composed) leave the cache as if the reordered rows had been decoded from the start;
    with autograd on, the same through plain copies."""
    src, tgt = _batch()
    full = tiny_model(src, tgt).log_softmax(-1).detach()
    with torch.inference_mode(inference):
        mask = tiny_model.source_mask(src)
        memory = tiny_model.encode(src, mask)
        cache = tiny_model.new_cache()
        for t in range(3):
            tiny_model.decode_step(tgt[:, t], memory, mask, cache)
        # Duplicate a row (beams), then reorder and drop one (a finished sentence).
        cache.reorder(torch.tensor([0, 0, 1, 2]), cross=True)
        cache.reorder(torch.tensor([3, 1]), cross=True)
        order = torch.tensor([2, 0])
        mask2, memory2 = mask[order], memory[order]
        for t in range(3, tgt.size(1)):
            lp, _ = tiny_model.decode_step(tgt[order, t], memory2, mask2, cache)
            assert (lp - full[order, t]).abs().max().item() < 1e-5
            cache.reorder(torch.tensor([0, 1]), cross=False)


def test_attention_weights_path_matches_fused_path(tiny_model: Transformer) -> None:
    src, tgt = _batch()
    mask = tiny_model.source_mask(src)
    memory = tiny_model.encode(src, mask)
    fused = tiny_model.decode(tgt, memory, mask)
    explicit = tiny_model.decode(tgt, memory, mask, need_weights=True)
    torch.testing.assert_close(explicit.hidden, fused.hidden, rtol=0, atol=1e-5)
    assert explicit.cross_attention is not None and fused.cross_attention is None
    weights = explicit.cross_attention[0]
    assert weights.shape == (3, 4, 7, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7))
    assert weights[2, :, :, 4:].abs().max().item() == 0.0  # padding gets no attention


def test_sinusoidal_positions_follow_the_formula() -> None:
    table = sinusoidal_positions(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embedding_scale_and_positions(tiny_model: Transformer) -> None:
    ids = torch.tensor([[5, 6, 7]])
    expected = (
        tiny_model.tgt_embed.tokens.weight[ids] * math.sqrt(32) + sinusoidal_positions(128, 32)[:3]
    )
    torch.testing.assert_close(tiny_model.tgt_embed(ids), expected)


def test_three_way_tie_shares_one_tensor(tiny_model: Transformer) -> None:
    w = tiny_model.src_embed.tokens.weight
    assert w is tiny_model.tgt_embed.tokens.weight
    assert w is tiny_model.output_weight
    tied = sum(1 for name, _ in tiny_model.named_parameters() if "tokens.weight" in name)
    assert tied == 1


@pytest.mark.parametrize("src_size", [30, 50])
def test_two_way_tie_with_separate_vocabularies(tiny_config: ModelConfig, src_size: int) -> None:
    """Two vocabularies never share the source embedding, even when their sizes match."""
    cfg = dataclasses.replace(
        tiny_config, src_vocab_size=src_size, tgt_vocab_size=50, joint_vocab=False
    )
    model = Transformer(cfg)
    assert model.src_embed.tokens.weight is not model.tgt_embed.tokens.weight
    assert model.output_weight is model.tgt_embed.tokens.weight
    src, tgt = torch.randint(4, src_size, (2, 5)), torch.randint(4, 50, (2, 4))
    assert model(src, tgt).shape == (2, 4, 50)


def test_a_joint_vocabulary_has_one_size(tiny_config: ModelConfig) -> None:
    with pytest.raises(ValueError, match="joint vocabulary has one size"):
        dataclasses.replace(tiny_config, src_vocab_size=30, tgt_vocab_size=50)


def test_learned_positions(tiny_config: ModelConfig) -> None:
    model = Transformer(dataclasses.replace(tiny_config, positions="learned")).eval()
    names = [n for n, _ in model.named_parameters() if "learned" in n]
    assert names == ["src_embed.learned.weight", "tgt_embed.learned.weight"]
    src, tgt = _batch()
    assert model(src, tgt).shape == (3, 7, 40)


def test_gradient_reaches_every_parameter(tiny_config: ModelConfig) -> None:
    model = Transformer(dataclasses.replace(tiny_config, dropout=0.1)).train()
    src, tgt = _batch()
    model(src, tgt).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


# The paper's parameter counts (Table 3), at a shared vocabulary of 40,000.
PAPER_COUNTS = [
    ({}, 65e6),
    ({"d_model": 1024, "d_ff": 4096, "n_heads": 16}, 213e6),
    ({"d_k": 16}, 58e6),
    ({"d_k": 32}, 60e6),
    ({"encoder_layers": 2, "decoder_layers": 2}, 36e6),
    ({"encoder_layers": 4, "decoder_layers": 4}, 50e6),
    ({"encoder_layers": 8, "decoder_layers": 8}, 80e6),
    ({"d_model": 256, "n_heads": 8}, 28e6),  # d_k = d_v = 32
    ({"d_model": 1024, "n_heads": 8}, 168e6),  # d_k = d_v = 128
    ({"d_ff": 1024}, 53e6),
    ({"d_ff": 4096}, 90e6),
]


@pytest.mark.parametrize(("changes", "paper"), PAPER_COUNTS)
def test_parameter_counts_match_the_paper(changes: dict[str, int], paper: float) -> None:
    cfg = dataclasses.replace(ModelConfig(src_vocab_size=40_000, tgt_vocab_size=40_000), **changes)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert abs(count_parameters(model) - paper) / paper < 0.03


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must divide model.d_model"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="dropout"):
        ModelConfig(dropout=1.5)
