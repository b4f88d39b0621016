"""Training-cost arithmetic: the counted FLOPs equal what PyTorch's own counter sees."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt_cli.core import flops
from nmt_cli.core.flops import forward_flops, matmul_rate, train_flops
from nmt_cli.core.transformer import ModelConfig, Transformer


def test_forward_flops_match_torchs_flop_counter() -> None:
    # d_k and d_v of their own (Table 3 row B) take the written-out attention, whose
    # products the counter sees one by one.
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=3, d_model=32, d_ff=48, n_heads=4, d_k=8, d_v=12,
        src_vocab_size=50, tgt_vocab_size=50, max_positions=64, dropout=0.0,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 5))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt)
    assert forward_flops(cfg, 3, 7, 5) == counter.get_total_flops()
    assert train_flops(cfg, 3, 7, 5) == 3 * counter.get_total_flops()


def test_base_model_costs_about_six_flops_per_parameter_and_token() -> None:
    """The rule of thumb, 6 x parameters x tokens, for base with equal source and target
    lengths: the products touch the encoder and decoder weights (44M) and the output
    projection (19M) once per target token; attention adds about 1% at length 25."""
    cfg = ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000)
    per_token = train_flops(cfg, 100, 25, 25) / (100 * 25)
    assert 6 * 63.0e6 < per_token < 6 * 63.0e6 * 1.02


class ScriptedProducts:
    """A clock, and a matrix whose each product takes the next of `durations` on it."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations = 0.0, durations

    def perf_counter(self) -> float:
        return self.now

    def randn(self, *_: object, **__: object) -> ScriptedProducts:
        return self

    def to(self, _: object) -> ScriptedProducts:
        return self

    def __matmul__(self, _: object) -> ScriptedProducts:
        self.now += self.durations.pop(0)
        return self


def test_matmul_rate_is_the_best_timed_product_after_the_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up product (the quickest here) is left out, and the rate is 2 n^3 FLOPs
    over the quickest of the `reps` timed products."""
    script = ScriptedProducts([0.125, 0.5, 0.25, 1.0])
    monkeypatch.setattr(flops, "time", script)
    monkeypatch.setattr(flops, "torch", script)
    assert matmul_rate(torch.device("cpu"), torch.float32, n=64, reps=3) == 2 * 64**3 / 0.25
    assert script.durations == []  # the warm-up and the three timed products, no more
