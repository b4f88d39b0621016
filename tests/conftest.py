"""Shared fixtures: tiny seeded models so the whole suite runs on a CPU in minutes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from nmt_cli.cpu_level import apply_to_torch_environment

# Before torch loads: NMT_CPU_LEVEL=avx2 (say) caps oneDNN and ATen too, so the whole suite
# runs as on a CPU of that level.
apply_to_torch_environment()

# isort: split
import torch  # noqa: E402

from nmt_cli.core.transformer import ModelConfig, Transformer  # noqa: E402

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Decoding tiny models is thousands of tiny operations: one thread is fastest, and on
    a busy 2-core machine two threads per operation can be 10-100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        dropout=0.0,
        src_vocab_size=40,
        tgt_vocab_size=40,
        max_positions=128,
    )


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config).eval()


def replace(cfg: ModelConfig, **changes: object) -> ModelConfig:
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]
