"""The parts the training loop is built from, each on its own: stop policy, checkpoint
keeper, reporter and feed."""

from __future__ import annotations

import io
import json
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

from nmt_cli.config import TrainConfig
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.train import train
from nmt_cli.engines.train.checkpoints import (
    CheckpointKeeper,
    Position,
    restore_train_state,
    train_state,
)
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.events import CheckpointSaved, StepDone, TrainEvent
from nmt_cli.engines.train.feed import TrainFeed, derive_split
from nmt_cli.engines.train.plan import plan_training
from nmt_cli.engines.train.report import Reporter
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.engines.train.step import UpdateStats
from nmt_cli.engines.train.stop import StopPolicy
from nmt_cli.engines.train.validate import DevFigures
from nmt_cli.errors import NmtError
from tests.fixtures.train_data import tiny_recipe, with_model

# -- stop policy ----------------------------------------------------------------------------


def test_stop_policy_order_of_decisions() -> None:
    policy = StopPolicy(TrainConfig(max_steps=10, save_interval_steps=4, max_time_minutes=1))
    assert policy.decide([0, 0, 0], step=3, skipped=False).stop is None
    assert policy.decide([0, 0, 0], step=4, skipped=False).save
    assert not policy.decide([0, 0, 0], step=4, skipped=True).save  # no new weights
    assert policy.decide([0, 1, 0], step=5, skipped=False).save  # save due by time
    assert policy.decide([0, 0, 1], step=5, skipped=False).stop == "max_time"
    assert policy.decide([0, 0, 1], step=10, skipped=False).stop == "max_steps"
    assert policy.decide([1, 0, 1], step=10, skipped=False).stop == "signal"
    assert policy.finished_before_start(10) and not policy.finished_before_start(9)


def test_stop_policy_flags_time_only_on_the_main_rank() -> None:
    policy = StopPolicy(TrainConfig(save_interval_minutes=1e-9, max_time_minutes=1e-9))
    assert policy.local_flags(1.0, signalled=False, is_main=True) == [0.0, 1.0, 1.0]
    assert policy.local_flags(1.0, signalled=True, is_main=False) == [1.0, 0.0, 0.0]
    unlimited = StopPolicy(TrainConfig(max_steps=0, save_interval_minutes=0))
    assert unlimited.local_flags(1e9, signalled=False, is_main=True) == [0.0, 0.0, 0.0]


# -- checkpoint keeper ----------------------------------------------------------------------


def _keeper(tmp_path: Path, data: Path, keep_last: int = 2) -> tuple[CheckpointKeeper, Transformer]:
    vocab = open_data_dir(data).vocab
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, n_heads=2,
        src_vocab_size=len(vocab.src), tgt_vocab_size=len(vocab.tgt), max_positions=32,
    )  # fmt: skip
    model = Transformer(cfg)
    return CheckpointKeeper(RunDir(tmp_path), cfg, vocab, {"name": "t"}, keep_last), model


def test_keeper_writes_best_by_dev_loss_and_rotates(tmp_path: Path, data: Path) -> None:
    keeper, model = _keeper(tmp_path, data)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    pos = Position()
    for step, loss in ((1, 3.0), (2, 2.0), (3, 2.5)):
        pos.step = step
        path, best = keeper.save_step(weights, pos, DevFigures(loss, loss - 0.1, None))
        assert best == (step != 3) and path == keeper.run.step_path(step)
    assert pos.best_dev_loss == 2.0
    assert [p.name for p in keeper.run.step_checkpoints()] == [
        "step_00000002.pt",
        "step_00000003.pt",
    ]
    best = load_checkpoint(keeper.run.best)
    assert best.step == 2 and best.meta["dev_loss"] == 2.0 and best.kind == "inference"
    assert keeper.newest_step_file == keeper.run.step_path(3) and keeper.has_step(3)


def test_last_checkpoint_round_trips_the_training_state(tmp_path: Path, data: Path) -> None:
    keeper, model = _keeper(tmp_path, data)
    opt = torch.optim.Adam(model.parameters())
    model(torch.tensor([[5, 3]]), torch.tensor([[2, 5]])).sum().backward()
    opt.step()
    pos = Position(epoch=2, batches_done=7, step=11, elapsed_s=4.5, skipped=1, best_dev_loss=1.5)
    state = train_state(opt, None, pos, seed=3, split={"world": 1})
    keeper.save_last(model.state_dict(), state)
    last = load_checkpoint(keeper.run.last)
    assert last.kind == "train" and last.step == 11
    fresh = torch.optim.Adam(Transformer(model.cfg).parameters())
    assert last.train_state is not None
    assert restore_train_state(last.train_state, fresh, None) == pos
    assert fresh.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


# -- reporter -------------------------------------------------------------------------------


def _stats(loss: float = 6.0, tokens: int = 3) -> UpdateStats:
    return UpdateStats(loss, loss / 2, tokens, grad_norm=1.0, skipped=False)


def test_reporter_emits_every_update_and_logs_every_interval(tmp_path: Path) -> None:
    events: list[TrainEvent] = []
    tc = TrainConfig(log_interval_steps=2, max_steps=10)
    reporter = Reporter(RunDir(tmp_path), tc, events.append, is_main=True)
    for step in (1, 2, 3, 4):
        reporter.update(
            _stats(), 3, 0.5, step=step, epoch=1, lr=1e-3, elapsed_s=step * 0.5, skipped=0
        )
    assert [e.step for e in events if isinstance(e, StepDone)] == [1, 2, 3, 4]
    done = events[-1]
    assert isinstance(done, StepDone) and done.loss == 2.0 and done.tokens_per_s == 6.0
    assert done.remaining_s == pytest.approx(6 * 0.5)  # 6 steps left at 0.5 s each
    records = [json.loads(x) for x in RunDir(tmp_path).metrics.read_text().splitlines()]
    assert [(r["type"], r["step"], r["loss"]) for r in records] == [
        ("train", 2, 2.0),
        ("train", 4, 2.0),
    ]
    reporter.checkpoint(4, 2.0, None, DevFigures(1.0, 0.5, 12.5), best=True)
    valid = json.loads(RunDir(tmp_path).metrics.read_text().splitlines()[-1])
    assert valid["type"] == "valid" and valid["dev_bleu"] == 12.5
    saved = events[-1]
    assert isinstance(saved, CheckpointSaved) and saved.best and saved.dev_bleu == 12.5


def test_reporter_is_silent_off_the_main_rank(tmp_path: Path) -> None:
    events: list[TrainEvent] = []
    reporter = Reporter(RunDir(tmp_path), TrainConfig(), events.append, is_main=False)
    reporter.update(_stats(), 3, 0.5, step=1, epoch=1, lr=1e-3, elapsed_s=0.5, skipped=0)
    reporter.log({"type": "train", "step": 1})
    assert not events and not RunDir(tmp_path).metrics.exists()


# -- feed -----------------------------------------------------------------------------------


def test_feed_resumes_mid_epoch_and_moves_on_to_the_next(data: Path) -> None:
    src, tgt = open_data_dir(data).split("train")
    split = derive_split(TrainConfig(batch_tokens=240, max_tokens=120), 1, src.lengths, tgt.lengths)
    ctx = DistContext(rank=0, world=1, local_rank=0, device=torch.device("cpu"))
    feed = TrainFeed(src, tgt, split, seed=1, ctx=ctx, max_epochs=2, name="data")
    everything = [(p.batches[0].tolist(), u) for p, u in feed.updates(Position())]
    per_epoch = feed.plan(0).updates
    assert len(everything) == 2 * per_epoch
    pos = Position(batches_done=2 * split.accum)  # two updates of epoch 0 done
    resumed = [(p.batches[0].tolist(), u) for p, u in feed.updates(pos)]
    assert resumed == everything[2:] and pos.epoch == 2
    batches = feed.micro_batches(feed.plan(0), 0)
    assert len(batches) == split.accum and all(w == 1.0 for _, w in batches)
    assert feed.micro_seeds(5) != feed.micro_seeds(6)


# -- the plan every rank starts from ----------------------------------------------------------


def test_plan_crosses_to_a_spawned_rank_with_the_checkpoint_path_alone(
    tmp_path: Path, data: Path
) -> None:
    """As `launch` hands it to a spawned rank (multiprocessing's pickler): the data
    directory, recipe and model configuration arrive whole; the checkpoint to resume as its
    path, which the rank reads once, and not as tensors through shared memory."""
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=1, save_interval_steps=0)
    train(recipe)
    plan = plan_training(recipe, open_data_dir(data), RunDir(tmp_path / "run"))
    tensors: list[torch.Tensor] = []

    class Spy(ForkingPickler):
        def persistent_id(self, obj: object) -> None:
            if isinstance(obj, torch.Tensor):
                tensors.append(obj)

    sent = io.BytesIO()
    Spy(sent).dump(plan)
    assert not tensors  # no weights in it
    copy = pickle.loads(sent.getvalue())
    assert copy.recipe == plan.recipe and copy.model_config == plan.model_config
    assert copy.data == plan.data and copy.run_root == plan.run_root
    assert copy.data.vocab.src.encode(["a b"]) == plan.data.vocab.src.encode(["a b"])
    assert plan.resume is not None and copy.resume is not None
    here, there = plan.resume.take(), copy.resume.take()
    assert here.step == there.step == 1
    for key, value in here.model.items():
        assert torch.equal(there.model[key], value)


def test_plan_of_a_fresh_run_resumes_nothing_and_sizes_the_model(
    tmp_path: Path, data: Path
) -> None:
    prepared = open_data_dir(data)
    plan = plan_training(tiny_recipe(data, tmp_path / "run"), prepared, RunDir(tmp_path / "run"))
    assert plan.resume is None
    assert plan.model_config.src_vocab_size == len(prepared.vocab.src)
    assert plan.model_config.joint_vocab


def test_plan_refuses_to_resume_another_model(tmp_path: Path, data: Path) -> None:
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=1, save_interval_steps=0)
    train(recipe)
    with pytest.raises(NmtError, match=r"model\.d_ff: 64 vs 128"):
        plan_training(with_model(recipe, d_ff=128), open_data_dir(data), RunDir(tmp_path / "run"))
