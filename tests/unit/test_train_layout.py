"""How a CPU run spreads over the cores (engines/train/layout.py), and the feed that
collates the next update's batches in the background (engines/train/feed.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nmt_cli.config import TrainConfig
from nmt_cli.core.batching import collate
from nmt_cli.data_dir import open_data_dir
from nmt_cli.engines.train import TrainOptions, train
from nmt_cli.engines.train import feed as feed_module
from nmt_cli.engines.train.checkpoints import Position
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.events import Notice, TrainEvent
from nmt_cli.engines.train.feed import TrainFeed, derive_split
from nmt_cli.engines.train.layout import (
    SHORT_RUN_S,
    Probe,
    choose_layout,
    expected_seconds,
    layout_of,
)
from nmt_cli.engines.train.plan import plan_training
from nmt_cli.engines.train.run_dir import RunDir
from tests.fixtures.train_data import tiny_recipe

CPU = torch.device("cpu")


def _never() -> float:
    raise AssertionError("a short run must not time the processes")


def test_a_short_run_keeps_one_process_without_timing_processes() -> None:
    layout = choose_layout(2, lambda s: 100 * s, lambda: 0.5, _never)
    assert (layout.procs, layout.threads) == (1, 2)
    assert "short run" in layout.reason and f"{100 * 0.5:.0f} s" in layout.reason


def test_a_long_run_takes_processes_only_when_faster_by_the_margin() -> None:
    def long(s: float) -> float:
        return 10 * SHORT_RUN_S

    faster = choose_layout(2, long, lambda: 1.0, lambda: 0.75)
    assert (faster.procs, faster.threads) == (2, 1)
    assert "1.33x" in faster.reason
    assert faster.describe() == "2 processes (DDP over gloo) of 1 thread each"
    close = choose_layout(2, long, lambda: 1.0, lambda: 0.85)
    assert (close.procs, close.threads) == (1, 2)
    assert close.describe() == "one process of 2 thread(s)"
    assert choose_layout(1, long, _never, _never).procs == 1


def test_the_layouts_are_timed_in_turn_and_one_slow_timing_does_not_decide() -> None:
    """The first timing of the threads is slow (the machine was busy for a moment): the
    later rounds, taken in turn with the processes', find them as fast."""
    calls: list[str] = []

    def timed(name: str, seconds: list[float]) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return seconds[calls.count(name) - 1]

        return run

    layout = choose_layout(
        2,
        lambda s: 10 * SHORT_RUN_S,
        timed("threads", [1.8, 1.0, 1.1]),
        timed("processes", [1.0, 1.05, 0.98]),
    )
    assert calls == ["threads", "processes"] * 3
    assert (layout.procs, layout.threads) == (1, 2)
    assert "1.02x" in layout.reason


def test_expected_seconds_is_the_nearer_limit() -> None:
    assert expected_seconds(TrainConfig(max_steps=100), 0.5) == 50
    assert expected_seconds(TrainConfig(max_steps=10**6, max_time_minutes=2), 1.0) == 120
    assert expected_seconds(TrainConfig(max_steps=0), 1.0) == float("inf")


def test_the_probe_runs_both_layouts_and_restores_the_thread_count(data: Path) -> None:
    recipe = tiny_recipe(data, data.parent / "unused")
    plan = plan_training(recipe, open_data_dir(data), RunDir(data.parent / "unused"))
    src, tgt = plan.data.split("train")
    before = torch.get_num_threads()
    probe = Probe(plan.model_config, src, tgt, src.lengths.argsort()[:8], 2, "fp32")
    assert probe.threads_s() > 0 and probe.processes_s() > 0
    assert torch.get_num_threads() == before
    assert [p.sentences for p in probe.parts] == [4, 4]


def test_layout_of_keeps_a_resumed_runs_layout_and_an_explicit_thread_count(
    data: Path,
) -> None:
    recipe = tiny_recipe(data, data.parent / "unused")
    plan = plan_training(recipe, open_data_dir(data), RunDir(data.parent / "unused"))
    resumed = layout_of(dataclasses.replace(plan, resumed_world=2), cores=4)
    assert (resumed.procs, resumed.threads) == (2, 2)
    threads = dataclasses.replace(recipe.train, threads=3)
    fixed = layout_of(
        dataclasses.replace(plan, recipe=dataclasses.replace(recipe, train=threads)), cores=4
    )
    assert (fixed.procs, fixed.threads) == (1, 3)
    auto = dataclasses.replace(recipe.train, threads=0)
    short = layout_of(  # a tiny model's run: seconds
        dataclasses.replace(plan, recipe=dataclasses.replace(recipe, train=auto)), cores=2
    )
    assert short.procs == 1 and "short run" in short.reason


def test_a_resumed_plan_records_the_world_its_run_began_with(data: Path, tmp_path: Path) -> None:
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=2)
    train(recipe, TrainOptions(procs=1))
    plan = plan_training(recipe, open_data_dir(data), RunDir(tmp_path / "run"))
    assert plan.resumed_world == 1


def test_train_says_which_layout_it_took(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nmt_cli.engines.train.loop.usable_cpus", lambda: 2)
    events: list[TrainEvent] = []
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=2, threads=0)
    train(recipe, TrainOptions(), events.append)
    said = [e.text for e in events if isinstance(e, Notice) and "CPU layout" in e.text]
    assert said and said[0].startswith("CPU layout: one process of 2 thread(s) (a short run")
    assert said[0] in (tmp_path / "run" / "train.log").read_text()


# -- the feed's background collation ----------------------------------------------------------


def _feed(data: Path, background: bool) -> TrainFeed:
    src, tgt = open_data_dir(data).split("train")
    split = derive_split(TrainConfig(batch_tokens=240, max_tokens=120), 1, src.lengths, tgt.lengths)
    ctx = DistContext(rank=0, world=1, local_rank=0, device=CPU)
    return TrainFeed(src, tgt, split, 1, ctx, 2, "data", background=background)


def test_batches_collated_in_the_background_are_the_ones_built_directly(data: Path) -> None:
    direct, ahead = _feed(data, False), _feed(data, True)
    try:
        walked = 0
        for (plan_a, update_a), (plan_b, update_b) in zip(
            direct.updates(Position()), ahead.updates(Position()), strict=True
        ):
            assert update_a == update_b
            for (a, wa), (b, wb) in zip(
                direct.micro_batches(plan_a, update_a),
                ahead.micro_batches(plan_b, update_b),
                strict=True,
            ):
                assert wa == wb and torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in)
                assert torch.equal(a.tgt_out, b.tgt_out) and a.tgt_tokens == b.tgt_tokens
            walked += 1
        assert walked == 2 * direct.plan(0).updates  # both epochs, across the boundary
    finally:
        ahead.close()


def test_a_collation_error_in_the_background_reaches_the_training_thread(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed = _feed(data, True)
    plan, update = next(feed.updates(Position()))
    assert plan.updates >= 2
    failing = {
        tuple(plan.batches[slot].tolist())
        for slot in plan.rank_slots(update + 1, 0)
        if slot is not None
    }

    def picky(src: object, tgt: object, indices: object, multiple: int = 1) -> object:
        if tuple(indices.tolist()) in failing:  # type: ignore[attr-defined]
            raise OSError("the token store went away")
        return collate(src, tgt, indices, multiple)  # type: ignore[arg-type]

    monkeypatch.setattr(feed_module, "collate", picky)
    try:
        assert feed.micro_batches(plan, update)  # fine; the next one fails in the worker
        with pytest.raises(OSError, match="went away"):
            feed.micro_batches(plan, update + 1)
    finally:
        feed.close()
