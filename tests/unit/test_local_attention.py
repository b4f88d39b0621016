"""Restricted self-attention (model.attention_window): the blocked computation against a
dense band mask, the model in training and in incremental decoding, its trimmed cache,
beam search over it, and the settings, checkpoint and CPU backend that carry it."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from decode_models import backend_decoder
from recompute import FullRecompute
from torch import Tensor

from nmt_cli.backends.cpu.support import unsupported
from nmt_cli.config import ConfigError, recipe_from_dict
from nmt_cli.core import local_attention
from nmt_cli.core import transformer as transformer_module
from nmt_cli.core.cache import DecoderCache
from nmt_cli.core.flops import forward_flops
from nmt_cli.core.local_attention import MIN_BLOCK, blocked_attention, scored_keys
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.search import beam_search
from nmt_cli.core.settings import SettingError
from nmt_cli.core.transformer import Transformer

# Longer than the blocks' span on either side (3 blocks in the encoder, 2 in the decoder),
# so the model computes in blocks rather than with a dense band mask.
SRC_LEN, TGT_LEN = 3 * MIN_BLOCK + 11, 2 * MIN_BLOCK + 9


def _model(window: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=16,
        d_ff=32,
        n_heads=2,
        dropout=0.0,
        src_vocab_size=30,
        tgt_vocab_size=30,
        max_positions=160,
        attention_window=window,
    )
    return Transformer(cfg).to(dtype).eval()


def _batch(src_len: int = SRC_LEN, tgt_len: int = TGT_LEN) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (2, src_len), generator=g)
    src[1, src_len - min(40, src_len // 3) :] = 0  # right padding, longer than a block
    return src, torch.randint(4, 30, (2, tgt_len), generator=g)


def _reference(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool, real: Tensor) -> Tensor:
    """softmax over the whole n x n matrix with the band written out: |i - j| < window,
    j <= i in the decoder, real keys only (and a padding query's own key, so that its
    unread row is not NaN)."""
    n = q.size(2)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = ((i - j).abs() < window) & ((j <= i) | (not causal)) & real[:, None, None, :]
    allowed |= i == j
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize(("n", "window"), [(150, 5), (150, 40), (97, 1), (200, 33)])
def test_blocks_equal_a_dense_band_mask_forward_and_backward(
    causal: bool, n: int, window: int
) -> None:
    g = torch.Generator().manual_seed(n + window)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    real = torch.ones(2, n, dtype=torch.bool)
    if not causal:
        real[1, n - 45 :] = False  # padding keys (the decoder's padding is causal)
    key_mask = None if causal else real[:, None, None, :]
    out_weights = torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
    out_weights[~real[:, None, :, None].expand_as(out_weights)] = 0  # padding rows unread
    grads = []
    for compute in (
        lambda q, k, v: blocked_attention(q, k, v, window, causal, key_mask, 0.0),
        lambda q, k, v: _reference(q, k, v, window, causal, real),
    ):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = compute(*leaves)
        (out * out_weights).sum().backward()
        grads.append([out.detach() * (out_weights != 0), *(x.grad for x in leaves)])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_blocks_score_n_times_a_span_not_n_squared() -> None:
    assert scored_keys(1000, 0, causal=False) == 1000  # full attention
    assert scored_keys(1000, 64, causal=False) == 192 and scored_keys(1000, 64, True) == 128
    assert scored_keys(1000, 3, causal=False) == 3 * MIN_BLOCK  # blocks have a floor
    assert scored_keys(50, 40, causal=False) == 50  # shorter than the span: dense band
    assert scored_keys(50, 64, causal=True) == 50  # a window past the end: full


def test_flops_count_the_scores_the_blocks_compute() -> None:
    full = ModelConfig(src_vocab_size=100, tgt_vocab_size=100)
    windowed = dataclasses.replace(full, attention_window=64)
    assert forward_flops(windowed, 1, 100, 60) == forward_flops(full, 1, 100, 60)  # dense
    width = full.n_heads * (full.head_dim_k + full.head_dim_v)
    saved = (
        2.0
        * 4096
        * width
        * ((4096 - 192) * full.encoder_layers + (4096 - 128) * full.decoder_layers)
    )
    assert forward_flops(full, 1, 4096, 4096) - forward_flops(windowed, 1, 4096, 4096) == saved


@pytest.fixture(scope="module")
def windowed() -> Transformer:
    return _model(window=4, dtype=torch.float64)


def test_the_model_equals_its_dense_band_mask_form(
    windowed: Transformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoder and decoder in blocks equal the same model with the band as an n x n mask
    (what runs when blocks would not be smaller), and the window changes the output."""
    src, tgt = _batch()
    blocked = windowed(src, tgt)
    monkeypatch.setattr(local_attention, "scored_keys", lambda length, *_: length)
    dense = windowed(src, tgt)
    torch.testing.assert_close(blocked, dense, rtol=1e-10, atol=1e-10)
    full = copy.deepcopy(windowed)
    for module in full.modules():
        if isinstance(module, transformer_module.MultiHeadAttention):
            module.window = 0
    assert not torch.allclose(full(src, tgt), dense)


def test_a_window_as_long_as_the_sequence_is_full_attention() -> None:
    src, tgt = _batch(src_len=20, tgt_len=15)
    full, long_window = _model(window=0), _model(window=20)
    torch.testing.assert_close(long_window(src, tgt), full(src, tgt), rtol=0, atol=0)


def _steps(model: Transformer, src: Tensor, tgt: Tensor) -> tuple[Tensor, DecoderCache]:
    mask = model.source_mask(src)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    sizes = []
    out = []
    for t in range(tgt.size(1)):
        out.append(model.decode_step(tgt[:, t], memory, mask, cache)[0])
        sizes.append({layer.self_k.size(2) for layer in cache.layers if layer.self_k is not None})
    window = model.cfg.attention_window
    assert sizes == [{min(t + 1, window)} for t in range(tgt.size(1))]  # at most r kept
    return torch.stack(out, 1), cache


def test_incremental_decoding_equals_teacher_forcing_with_a_trimmed_cache(
    windowed: Transformer,
) -> None:
    src, tgt = _batch()
    with torch.no_grad():
        forced = windowed(src, tgt).log_softmax(-1)
        stepped, _ = _steps(windowed, src, tgt)
    # (the cache attends in float32 on a CPU, and the step returns float32)
    torch.testing.assert_close(stepped, forced.float(), rtol=1e-5, atol=1e-5)


def test_a_reordered_trimmed_cache_continues_the_reordered_rows(windowed: Transformer) -> None:
    """Beam search's reorders within a sentence (swapped and duplicated rows, applied as
    the next position is appended) composed with the trimming, past the window."""
    src, tgt = _batch(src_len=12, tgt_len=10)
    src = src[[0, 0]]  # one sentence, two different target prefixes: two beams
    with torch.no_grad():
        forced = windowed(src, tgt).log_softmax(-1).float()
        mask = windowed.source_mask(src)
        memory = windowed.encode(src, mask)
        cache = windowed.new_cache()
        order = torch.arange(2)  # which target row each cache row continues
        for t in range(tgt.size(1)):
            step, _ = windowed.decode_step(tgt[order, t], memory, mask, cache)
            torch.testing.assert_close(step, forced[order, t], rtol=1e-5, atol=1e-5)
            index = torch.tensor([1, 1] if t == 6 else [1, 0])
            cache.reorder(index, cross=False)
            order = order[index]


def test_step_weights_cover_the_whole_prefix_with_zeros_outside_the_window(
    windowed: Transformer,
) -> None:
    """What `nmt attention` records: one weight per fed token, the window's summing to 1."""
    src, tgt = _batch(src_len=12, tgt_len=7)
    with torch.no_grad():
        mask = windowed.source_mask(src)
        memory = windowed.encode(src, mask)
        cache = windowed.new_cache()
        for t in range(tgt.size(1)):
            _, weights = windowed.decode_step(tgt[:, t], memory, mask, cache, need_weights=True)
            assert weights is not None
            own = weights[0]  # the first decoder layer's self-attention (B, h, 1, t + 1)
            assert own.shape == (2, 2, 1, t + 1)
            assert (own[..., : max(0, t + 1 - 4)] == 0).all()
            torch.testing.assert_close(own.sum(-1), torch.ones(2, 2, 1, dtype=own.dtype))


def test_beam_search_with_a_window_equals_search_without_a_cache() -> None:
    model = _model(window=3, seed=2, dtype=torch.float64)
    src, _ = _batch(src_len=14)
    src[:, -1] = 3  # EOS
    got = beam_search(model, src, 3, max_len_b=12, nbest=2)
    want = beam_search(FullRecompute(model), src, 3, max_len_b=12, nbest=2)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert max(len(h.tokens) for s in got for h in s) > 3  # the window was passed
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.score == pytest.approx(y.score, abs=1e-9)


def test_training_in_blocks_lowers_the_loss_and_matches_the_dense_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src, tgt = _batch()
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    tokens = int(tgt_out.numel())

    def gradient(model: Transformer) -> tuple[Tensor, list[Tensor]]:
        model.zero_grad()
        loss, _ = TrainingObjective(model, 0.1, 0, fused_projection=False)(
            src, tgt_in, tgt_out, tokens=tokens
        )
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model = _model(window=5).train()
    loss, grads = gradient(model)
    with monkeypatch.context() as patch:
        patch.setattr(local_attention, "scored_keys", lambda length, *_: length)
        dense_loss, dense_grads = gradient(model)
    torch.testing.assert_close(loss, dense_loss)
    for got, want in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # two summation orders
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss, _ = gradient(model)
        optimizer.step()
        losses.append(float(loss))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_the_window_is_a_checked_setting_and_needs_checkpoint_version_2(
    tmp_path: Path,
) -> None:
    from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint

    assert ModelConfig().attention_window == 0
    assert recipe_from_dict({"model": {"attention_window": 64}}).model.attention_window == 64
    with pytest.raises(SettingError, match="model.attention_window must be at least 0"):
        ModelConfig(attention_window=-1)
    with pytest.raises(ConfigError, match="model.attention_window"):
        recipe_from_dict({"model": {"attention_window": -3}})
    model = _model(window=4)
    vocab = _vocab()
    save_checkpoint(Checkpoint(model.cfg, vocab, model_state(model)), tmp_path / "w.pt")
    assert torch.load(tmp_path / "w.pt", weights_only=True)["version"] == 2  # v1 refuses it
    assert load_checkpoint(tmp_path / "w.pt").build_model().cfg.attention_window == 4


def _vocab() -> Any:
    from nmt_cli.core.vocab import VocabPair, train_sentencepiece

    proto = train_sentencepiece([f"w{i} x{i % 7}" for i in range(200)], vocab_size=30)
    return VocabPair.from_protos(proto, proto)


def test_the_cpu_backend_decodes_a_window_on_the_reference_step(kernel: ModuleType) -> None:
    assert unsupported(ModelConfig(attention_window=8), "fp32") == ["model.attention_window=8"]
    assert unsupported(ModelConfig(), "fp32") == []
    model = _model(window=3)
    told: list[str] = []
    decoder = backend_decoder(model, "fp32", told.append)
    assert told == ["the compiled step does not implement model.attention_window=3"]
    assert decoder.step is None and isinstance(decoder.new_cache(), DecoderCache)
    src, _ = _batch(src_len=10)
    src[:, -1] = 3
    got = beam_search(decoder, src, 3, max_len_b=10)
    want = beam_search(model, src, 3, max_len_b=10)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]


def test_attention_dropout_drops_weights_inside_the_band() -> None:
    """Dropout acts on the attention weights, kept ones scaled by 1 / (1 - p): with the
    identity as values the output is the weight matrix itself."""
    n, window, p = 100, 6, 0.5
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, n, 4, generator=g) for _ in range(2))
    v = torch.eye(n).expand(1, 2, n, n)
    weights = blocked_attention(q, k, v, window, False, None, 0.0)
    assert torch.equal(weights, blocked_attention(q, k, v, window, False, None, 0.0))
    torch.manual_seed(0)
    dropped = blocked_attention(q, k, v, window, False, None, p)
    kept = dropped != 0
    assert not kept[weights == 0].any()  # nothing outside the band
    torch.testing.assert_close(dropped[kept], weights[kept] / (1 - p))
    assert 0.4 < kept.sum() / (weights != 0).sum() < 0.6


@pytest.fixture(scope="module")
def blocks_inputs() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Queries, keys and values (B, h, n, d) spanning several blocks, and a padding mask."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 150, 8, generator=g) for _ in range(3))
    key_mask = torch.ones(2, 1, 1, 150, dtype=torch.bool)
    key_mask[1, ..., 110:] = False
    return q, k, v, key_mask


def test_blocks_under_bf16_autocast_match_fp32(
    blocks_inputs: tuple[Tensor, Tensor, Tensor, Tensor],
) -> None:
    q, k, v, key_mask = blocks_inputs
    want = blocked_attention(q, k, v, 5, False, key_mask, 0.0)
    low = [x.to(torch.bfloat16) for x in (q, k, v)]  # what autocast's projections give
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = blocked_attention(*low, 5, False, key_mask, 0.0)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_blocks_trace_into_one_graph(blocks_inputs: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
    """torch.compile captures the blocks whole (no graph break), with the same values and
    gradients; the graph-only backend keeps the check to seconds."""
    q, k, v, key_mask = blocks_inputs
    compiled = torch.compile(blocked_attention, backend="eager", fullgraph=True)
    results = []
    for attend in (blocked_attention, compiled):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attend(*leaves, 5, True, None, 0.0) + attend(*leaves, 5, False, key_mask, 0.0)
        out.square().sum().backward()
        results.append([out.detach(), *(x.grad for x in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
