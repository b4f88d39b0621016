"""The GPU training step's parts, run on the CPU: shape buckets, the device's choices,
the 16-bit LayerNorm, the device-side skip of non-finite updates, prefetching, and the
model under torch.compile."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from nmt_cli.backends import pytorch as pytorch_backend
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.config import TrainConfig
from nmt_cli.core.batching import collate, length_grouped_batches, real_token_fraction
from nmt_cli.core.data import TokenStore
from nmt_cli.core.norm import LayerNorm, low_precision_layer_norm
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.operations import REFERENCE, Operations
from nmt_cli.core.schedule import paper_adam
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import EOS_ID, PAD_ID
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.train.checkpoints import Position
from nmt_cli.engines.train.device_choices import choose
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.feed import TrainFeed, derive_split
from nmt_cli.engines.train.step import Updater

CPU = torch.device("cpu")


def _stores(n: int = 40, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 40, int(k)) for k in rng.integers(2, 14, n)]
    tgt = [rng.integers(4, 40, int(k)) for k in rng.integers(2, 14, n)]
    return src, tgt


def _sgd(model: Transformer) -> torch.optim.Optimizer:
    """SGD, whose update (at lr 1) is the gradient itself: Adam's first step is about
    lr * sign(g), which turns rounding noise in zero gradients into whole steps."""
    return torch.optim.SGD(model.parameters(), lr=1.0)


def _model(cfg: ModelConfig, operations: Operations = REFERENCE) -> Transformer:
    torch.manual_seed(0)
    return Transformer(cfg, operations)


# -- shape buckets --------------------------------------------------------------------------


def test_widths_round_up_to_the_multiple_and_the_cut_counts_the_rounding() -> None:
    rng = np.random.default_rng(3)
    src_len = rng.integers(1, 40, size=400)
    tgt_len = np.clip(src_len + rng.integers(-5, 6, size=400), 1, 45)
    src = [np.full(int(k), 5) for k in src_len]
    tgt = [np.full(int(k), 6) for k in tgt_len]
    batches = length_grouped_batches(src_len, tgt_len, 200, seed=1, epoch=0, multiple=8)
    assert sorted(np.concatenate(batches).tolist()) == list(range(400))
    for b in batches:
        batch = collate(src, tgt, b, multiple=8)
        assert batch.src.size(1) % 8 == 0 and batch.tgt_in.size(1) % 8 == 0
        width = max(batch.src.size(1), batch.tgt_in.size(1))
        assert len(b) * width <= 200 or len(b) == 1
        assert batch.src_tokens == int(src_len[b].sum()) + len(b)  # counts stay real
        assert batch.tgt_tokens == int(tgt_len[b].sum()) + len(b)
    plain = real_token_fraction(src_len, tgt_len, 200)
    assert real_token_fraction(src_len, tgt_len, 200, multiple=8) < plain


@pytest.mark.parametrize("fused_projection", [False, True])
def test_bucketed_padding_gives_the_unbucketed_loss_and_update(
    tiny_config: ModelConfig, fused_projection: bool
) -> None:
    """The same sentences padded to their longest and to a multiple of 8: masking makes
    the extra padding invisible to the loss, its gradient and so the Adam update."""
    src, tgt = _stores()
    indices = np.arange(12)
    stats, weights = [], []
    for multiple in (1, 8):
        batch = collate(src, tgt, indices, multiple)
        model = _model(tiny_config)
        objective = TrainingObjective(model, 0.1, 0, fused_projection)
        updater = Updater(objective, _sgd(model), "fp32", CPU, 0.0, 1)
        stats.append(updater.update([(batch, 1.0)], batch.tgt_tokens, 1.0, [0]))
        weights.append(model.state_dict())
    assert collate(src, tgt, indices, 8).tgt_in.size(1) > collate(src, tgt, indices).tgt_in.size(1)
    assert stats[0].loss_sum == pytest.approx(stats[1].loss_sum, rel=1e-6)
    assert stats[0].nll_sum == pytest.approx(stats[1].nll_sum, rel=1e-6)
    assert stats[0].grad_norm == pytest.approx(stats[1].grad_norm, rel=1e-5)
    assert stats[0].tokens == stats[1].tokens
    for key, value in weights[0].items():
        torch.testing.assert_close(weights[1][key], value, rtol=1e-5, atol=1e-6)


def test_fused_and_unfused_objectives_make_the_same_update(tiny_config: ModelConfig) -> None:
    src, tgt = _stores()
    batch = collate(src, tgt, np.arange(16))
    stats, weights = [], []
    for fused in (False, True):
        model = _model(tiny_config)
        objective = TrainingObjective(model, 0.1, 0, fused)
        updater = Updater(objective, _sgd(model), "fp32", CPU, 0.0, 1)
        stats.append(updater.update([(batch, 1.0)], batch.tgt_tokens, 1.0, [0]))
        weights.append(model.state_dict())
    assert stats[0].loss_sum == stats[1].loss_sum and stats[0].nll_sum == stats[1].nll_sum
    for key, value in weights[0].items():
        torch.testing.assert_close(weights[1][key], value, rtol=1e-5, atol=1e-6)


# -- the device's choices -------------------------------------------------------------------


def test_gpus_get_the_speed_ups_and_cpus_keep_their_paths() -> None:
    cpu = choose(TrainConfig(), CPU)
    assert not cpu.compile_model and not cpu.fused_projection and not cpu.prefetch
    assert cpu.shape_multiple == 1
    gpu = choose(TrainConfig(), torch.device("cuda"))
    assert gpu.compile_model and gpu.fused_projection and gpu.prefetch
    assert gpu.shape_multiple == 8 and gpu.attention_backend == "auto"
    assert "torch.compile on" in gpu.describe()
    assert not choose(TrainConfig(compile=False), torch.device("cuda")).compile_model
    assert choose(TrainConfig(compile=True), CPU).compile_model
    flash = choose(TrainConfig(attention_backend="flash"), torch.device("cuda"))
    assert flash.attention_backend == "flash"


def test_recipe_refuses_unknown_compile_and_attention_settings() -> None:
    with pytest.raises(ValueError, match="train.compile"):
        TrainConfig(compile="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="train.attention_backend"):
        TrainConfig(attention_backend="fastest")  # type: ignore[arg-type]


# -- LayerNorm ------------------------------------------------------------------------------


def test_layer_norm_in_16_bit_matches_fp32_to_its_rounding() -> None:
    torch.manual_seed(0)
    norm = LayerNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.1, 0.1)
    x = (torch.randn(10, 64) * 3 + 1).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = low_precision_layer_norm(norm, x)
    assert low.dtype == torch.bfloat16
    reference = F.layer_norm(x.float(), (64,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(low.float(), reference, rtol=1e-2, atol=2e-2)
    # On a CPU the module is nn.LayerNorm exactly.
    torch.testing.assert_close(norm(x.float()), reference, rtol=0, atol=0)


# -- the update step ------------------------------------------------------------------------


def test_fused_adam_skips_a_non_finite_update_on_the_device(tiny_config: ModelConfig) -> None:
    src, tgt = _stores()
    batch = collate(src, tgt, np.arange(8))
    model = _model(tiny_config)
    optimizer = paper_adam(model.parameters())
    objective = TrainingObjective(model, 0.1, 0, fused_projection=False)
    updater = Updater(objective, optimizer, "fp32", CPU, 1.0, 1)
    assert updater.skip_on_device
    first = updater.update([(batch, 1.0)], batch.tgt_tokens, 1e-3, [0])
    assert not first.skipped
    before = copy.deepcopy(model.state_dict())
    moments = copy.deepcopy(optimizer.state_dict()["state"])
    with torch.no_grad():
        model.encoder[0].ffn.w1.weight[0, 0] = float("nan")
    before["encoder.0.ffn.w1.weight"][0, 0] = float("nan")
    pending = updater.launch([(batch, 1.0)], batch.tgt_tokens, 1e-3, [1])
    stats = pending.result()
    assert stats.skipped and not np.isfinite(stats.grad_norm)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], equal_nan=True, rtol=0, atol=0)
    after = optimizer.state_dict()["state"]
    for index, state in moments.items():
        assert torch.equal(after[index]["step"], state["step"])
        assert torch.equal(after[index]["exp_avg"], state["exp_avg"])
    assert not hasattr(optimizer, "found_inf")


def test_prefetched_batches_are_the_ones_handed_out(data: Path) -> None:
    """`prefetch` builds an update's batches ahead; the next `micro_batches` for that update
    hands out those, and only once: asked again, it builds them anew. Seen from outside by
    changing the store's source ids in between (it is mapped copy-on-write: the change is
    this process's alone): the batches built ahead still hold the old ids."""
    split = derive_split(TrainConfig(batch_tokens=240, max_tokens=120), 1, *_lengths(data))
    ctx = DistContext(rank=0, world=1, local_rank=0, device=CPU)

    def feed_and_stores() -> tuple[TrainFeed, TokenStore]:
        src, tgt = open_data_dir(data).split("train")
        return TrainFeed(src, tgt, split, 1, ctx, 1, "data", multiple=8), src

    feed, src = feed_and_stores()
    reference, _ = feed_and_stores()  # the same batches, from stores left as they are
    plan, update = next(feed.updates(Position()))
    expected = reference.micro_batches(next(reference.updates(Position()))[0], update + 1)
    feed.prefetch(plan, update + 1)
    unseen = int(src.tokens.max()) + 1  # an id the data never had
    src.tokens[:] = unseen
    ahead = feed.micro_batches(plan, update + 1)  # built before the change
    again = feed.micro_batches(plan, update + 1)  # built now
    assert len(ahead) == len(again) == len(expected) == split.accum
    for (a, wa), (b, wb), (e, we) in zip(ahead, again, expected, strict=True):
        assert wa == wb == we and torch.equal(a.src, e.src) and torch.equal(a.tgt_out, e.tgt_out)
        assert set(b.src.unique().tolist()) == {unseen, EOS_ID, PAD_ID}
        assert a.src.shape == b.src.shape and a.src.size(1) % 8 == 0
    feed.prefetch(plan, plan.updates)  # past the epoch's end: nothing
    assert feed.micro_batches(plan, 0)[0][0].src.size(1) % 8 == 0


def _lengths(data: Path) -> tuple[np.ndarray, np.ndarray]:
    src, tgt = open_data_dir(data).split("train")
    return src.lengths, tgt.lengths


# -- torch.compile --------------------------------------------------------------------------


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one(
    tiny_config: ModelConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's code traces under torch.compile with dynamic shapes (the graph-only
    backend, so the check takes seconds: code generation is PyTorch's own business):
    same loss and gradients as eager, over batches of several shapes; and the SDPA
    kernel scope a GPU enters traces too (forced on the CPU's evaluation path). One layer
    a stack: every layer runs the same code, and tracing each costs some 20 s on a CPU."""
    cfg = dataclasses.replace(tiny_config, encoder_layers=1, decoder_layers=1)
    src, tgt = _stores(60)
    gpu = machine_plan(Target(torch.device("cuda"), training=True)).operations  # a GPU's
    eager_model = _model(cfg, gpu)
    compiled_model = _model(cfg, gpu)
    eager = TrainingObjective(eager_model, 0.1, 0, fused_projection=True)
    compiled = TrainingObjective(compiled_model, 0.1, 0, True, compile_backend="aot_eager")
    for lo, hi, multiple in ((0, 5, 8), (5, 14, 1)):
        batch = collate(src, tgt, np.arange(lo, hi), multiple)
        results = []
        for objective, model in ((eager, eager_model), (compiled, compiled_model)):
            model.zero_grad(set_to_none=True)
            loss, nll = objective(batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_tokens)
            loss.backward()
            results.append((loss.detach(), nll, [p.grad for p in model.parameters()]))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-5)
        for a, b in zip(results[0][2], results[1][2], strict=True):
            assert a is not None and b is not None
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(pytorch_backend, "sdpa_backends", lambda *_: [SDPBackend.MATH])
    forward = torch.compile(eager_model.eval().forward, dynamic=True, backend="aot_eager")
    batch = collate(src, tgt, np.arange(6), 8)
    with torch.no_grad():
        torch.testing.assert_close(
            forward(batch.src, batch.tgt_in), eager_model(batch.src, batch.tgt_in)
        )
