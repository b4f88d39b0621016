"""Length-grouped max-token batches, epoch plans over ranks, and collation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from train_data import batch_of

from nmt_cli.core.batching import length_grouped_batches, plan_epoch
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture
def lengths() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    src = rng.integers(1, 40, size=500)
    tgt = np.clip(src + rng.integers(-5, 6, size=500), 1, 45)
    return src, tgt


def test_every_example_once_per_epoch(lengths: tuple[np.ndarray, np.ndarray]) -> None:
    src, tgt = lengths
    for epoch in range(3):
        batches = length_grouped_batches(src, tgt, max_tokens=200, seed=7, epoch=epoch)
        ids = np.concatenate(batches)
        assert sorted(ids.tolist()) == list(range(len(src)))


def test_batches_fit_max_tokens_and_group_lengths(
    lengths: tuple[np.ndarray, np.ndarray],
) -> None:
    src, tgt = lengths
    batches = length_grouped_batches(src, tgt, max_tokens=200, seed=1, epoch=0)
    for b in batches:
        width = max(int((src[b] + 1).max()), int((tgt[b] + 1).max()))
        assert len(b) * width <= 200
        assert int(tgt[b].max()) - int(tgt[b].min()) <= 2  # sorted by length: tight groups
    # Greedy cutting: batches are full, not one sentence each.
    assert len(batches) < len(src) / 3


def test_oversize_pair_gets_its_own_batch() -> None:
    src = np.array([3, 50, 4, 2])
    tgt = np.array([3, 5, 60, 2])
    batches = length_grouped_batches(src, tgt, max_tokens=20, seed=0, epoch=0)
    assert sorted(np.concatenate(batches).tolist()) == [0, 1, 2, 3]
    assert {tuple(b) for b in batches if len(b) == 1} >= {(1,), (2,)}


def test_seeded_and_different_per_epoch(lengths: tuple[np.ndarray, np.ndarray]) -> None:
    src, tgt = lengths

    def order(seed: int, epoch: int) -> list[int]:
        return np.concatenate(length_grouped_batches(src, tgt, 200, seed, epoch)).tolist()

    assert order(5, 2) == order(5, 2)
    assert order(5, 2) != order(5, 3)
    assert order(5, 2) != order(6, 2)
    fixed = length_grouped_batches(src, tgt, 200, seed=1, epoch=1, shuffle=False)
    again = length_grouped_batches(src, tgt, 200, seed=9, epoch=4, shuffle=False)
    assert [b.tolist() for b in fixed] == [b.tolist() for b in again]


@pytest.mark.parametrize(("world", "accum"), [(1, 1), (1, 3), (2, 1), (4, 2)])
def test_plan_gives_every_batch_to_exactly_one_rank_slot(
    lengths: tuple[np.ndarray, np.ndarray], world: int, accum: int
) -> None:
    src, tgt = lengths
    plan = plan_epoch(src, tgt, 150, seed=2, epoch=0, world=world, accum=accum)
    seen: list[int] = []
    for update in range(plan.updates):
        slots = [plan.rank_slots(update, r) for r in range(world)]
        assert all(len(s) == accum for s in slots)  # same number of passes on every rank
        real = [i for s in slots for i in s if i is not None]
        assert plan.update_tgt_tokens(update) == sum(int(plan.tgt_tokens[i]) for i in real)
        if update < plan.updates - 1:
            assert len(real) == world * accum  # only the last update has empty slots
        seen.extend(real)
    assert sorted(seen) == list(range(len(plan.batches)))
    assert int(plan.tgt_tokens.sum()) == int((tgt + 1).sum())


def test_plan_batches_do_not_depend_on_world_size(
    lengths: tuple[np.ndarray, np.ndarray],
) -> None:
    """The resume position is counted in batches, valid whatever the device count."""
    src, tgt = lengths
    one = plan_epoch(src, tgt, 150, seed=2, epoch=1, world=1, accum=2)
    two = plan_epoch(src, tgt, 150, seed=2, epoch=1, world=2, accum=1)
    assert [b.tolist() for b in one.batches] == [b.tolist() for b in two.batches]
    assert one.rank_slots(3, 0) == two.rank_slots(3, 0) + two.rank_slots(3, 1)


def test_collate_follows_the_model_conventions(tmp_path: Path) -> None:
    batch = batch_of([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])])
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert (batch.src_tokens, batch.tgt_tokens, batch.sentences) == (6, 8, 2)
