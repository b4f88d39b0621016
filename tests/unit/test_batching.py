"""Length-grouped max-token batches, epoch plans over ranks, and collation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt_cli.core.batching import collate, length_grouped_batches, pad_sources, plan_epoch
from nmt_cli.core.data import TokenStore
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID
from tests.fixtures.train_data import batch_of, write_store


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


def test_a_batch_takes_every_pair_that_fits_exactly() -> None:
    """max_tokens bounds the padded batch, which may reach it: pairs of 3 tokens (4 with
    EOS and BOS) fill 8 two at a time. Counted at a multiple of 8, as collate pads them,
    pairs of 5 tokens (6) take 8 each: two per 16, and their padded tensors hold 16."""
    three = np.full(6, 3)
    batches = length_grouped_batches(three, three, max_tokens=8, seed=0, epoch=0, shuffle=False)
    assert [len(b) for b in batches] == [2, 2, 2]
    five = np.full(6, 5)
    padded = length_grouped_batches(five, five, 16, seed=0, epoch=0, shuffle=False, multiple=8)
    assert [len(b) for b in padded] == [2, 2, 2]
    rows = [list(range(4, 9))] * 6
    for b in padded:
        batch = collate(rows, rows, b, multiple=8)
        assert batch.src.shape == batch.tgt_in.shape == (2, 8)


def test_the_batches_themselves_come_in_a_seeded_random_order(
    lengths: tuple[np.ndarray, np.ndarray],
) -> None:
    """Cut in length order, then shuffled: an epoch does not run from short sentences to
    long ones, and the next epoch takes the same kind of batches in another order."""
    src, tgt = lengths

    def longest(epoch: int, shuffle: bool = True) -> list[int]:
        batches = length_grouped_batches(src, tgt, 200, seed=5, epoch=epoch, shuffle=shuffle)
        return [int(tgt[b].max()) for b in batches]

    in_order = longest(0, shuffle=False)
    assert in_order == sorted(in_order)
    first, second = longest(0), longest(1)
    assert sorted(first) == sorted(second) == in_order
    assert first != in_order and first != in_order[::-1] and first != second


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


@pytest.mark.parametrize("multiple", [1, 8])
def test_collate_gathers_any_examples_of_a_store_or_a_list_alike(
    tmp_path: Path, multiple: int
) -> None:
    """Collation gathers the whole batch at once: every row is still its own example's
    ids between BOS/EOS and padding, for examples in any order, empty ones included,
    from a memory-mapped store (70,000 ids: 32-bit tokens) as from in-memory arrays."""
    rng = np.random.default_rng(5)
    seqs = [rng.integers(4, 70_000, size=n).tolist() for n in rng.integers(0, 30, size=60)]
    seqs[7] = []
    write_store(tmp_path / "s", 70_000, seqs)
    store = TokenStore(tmp_path / "s")
    indices = rng.permutation(60)[:25]
    indices[3] = 7
    batch = collate(store, store, indices, multiple)
    as_lists = collate([np.array(s) for s in seqs], seqs, indices, multiple)
    for side in ("src", "tgt_in", "tgt_out"):
        got, want = getattr(batch, side), getattr(as_lists, side)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
    width = -(-(max(len(seqs[i]) for i in indices) + 1) // multiple) * multiple
    assert batch.src.shape == batch.tgt_in.shape == (25, width)
    for row, i in enumerate(indices):
        ids, pad = seqs[i], [PAD_ID] * (width - len(seqs[i]) - 1)
        assert batch.src[row].tolist() == [*ids, EOS_ID, *pad]
        assert batch.tgt_in[row].tolist() == [BOS_ID, *ids, *pad]
        assert batch.tgt_out[row].tolist() == [*ids, EOS_ID, *pad]
    total = sum(len(seqs[i]) + 1 for i in indices)
    assert (batch.src_tokens, batch.tgt_tokens) == (total, total)
    assert pad_sources([seqs[i] for i in indices], multiple).tolist() == batch.src.tolist()


# Vocabulary sizes whose stores `nmt prepare` writes as uint8, uint16 and int32
# (`smallest_dtype`): the ids run up to each type's largest and over its top bit, where a
# sign slip shows.
STORE_VOCABS = [(256, np.uint8), (65_536, np.uint16), (70_000, np.int32)]


def _ops_on_limited_dtypes(run: Callable[[], object]) -> set[str]:
    """The PyTorch operations `run` applies to a tensor of a dtype that PyTorch documents
    as having limited eager support (uint16/32/64): torch 2.11 has no CPU `where` for
    uint16, for one, so a collation that depends on them fails there."""
    from torch.utils._python_dispatch import TorchDispatchMode

    limited = {torch.uint16, torch.uint32, torch.uint64}
    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs or {}))]
            if any(isinstance(t, torch.Tensor) and t.dtype in limited for t in tensors):
                seen.add(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        run()
    return seen


@pytest.mark.parametrize(("vocab_size", "dtype"), STORE_VOCABS)
@pytest.mark.parametrize("multiple", [1, 8])
def test_collate_pads_the_ids_of_every_store_dtype(
    tmp_path: Path, vocab_size: int, dtype: type, multiple: int
) -> None:
    top, half = vocab_size - 1, vocab_size // 2  # half: the first id with the top bit set
    seqs = [[top, 4, top - 1], [], [5], [top, top, top, top, half - 1, half, 1]]
    write_store(tmp_path / "s", vocab_size, seqs)
    store = TokenStore(tmp_path / "s")
    assert store.dtype == dtype
    batch = collate(store, store, np.array([3, 1, 0, 2]), multiple)
    width = 8
    pad = lambda row: row + [PAD_ID] * (width - len(row))  # noqa: E731
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.int64
    assert batch.src.tolist() == [
        [top, top, top, top, half - 1, half, 1, EOS_ID],
        pad([EOS_ID]),
        pad([top, 4, top - 1, EOS_ID]),
        pad([5, EOS_ID]),
    ]
    assert batch.tgt_in.tolist() == [
        [BOS_ID, top, top, top, top, half - 1, half, 1],
        pad([BOS_ID]),
        pad([BOS_ID, top, 4, top - 1]),
        pad([BOS_ID, 5]),
    ]
    assert batch.tgt_out.tolist() == batch.src.tolist()
    assert (batch.src_tokens, batch.tgt_tokens) == (15, 15)  # 11 ids + 4 EOS or BOS


@pytest.mark.parametrize(("vocab_size", "dtype"), STORE_VOCABS)
def test_collation_applies_no_operation_to_a_limited_unsigned_dtype(
    tmp_path: Path, vocab_size: int, dtype: type
) -> None:
    seqs = [[vocab_size - 1, 7], [9]]
    write_store(tmp_path / "s", vocab_size, seqs)
    store = TokenStore(tmp_path / "s")
    assert store.dtype == dtype
    ops = _ops_on_limited_dtypes(lambda: collate(store, store, np.array([0, 1]), multiple=8))
    assert ops == set()


def test_a_store_of_empty_rows_only_collates_to_eos_and_padding(tmp_path: Path) -> None:
    write_store(tmp_path / "s", 65_536, [[], []])
    store = TokenStore(tmp_path / "s")
    batch = collate(store, store, np.array([1, 0]))
    assert batch.src.tolist() == [[EOS_ID], [EOS_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID], [BOS_ID]]
