"""Averaging arithmetic over state dicts: exact means, wide sums, refusals that name keys."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

from nmt_cli.core.averaging import AveragingError, StateAverager, first_difference


def mean_of(
    states: list[dict[str, torch.Tensor]], integers: Literal["equal", "last"] = "last"
) -> dict[str, torch.Tensor]:
    """The mean as `nmt average-checkpoints` takes it: added one at a time."""
    averager = StateAverager(integers=integers)
    for state in states:
        averager.add(state)
    return averager.result()


def test_mean_of_known_tensors_is_exact() -> None:
    states = [
        {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.5]])},
        {"w": torch.tensor([3.0, 4.0, 5.0]), "b": torch.tensor([[1.5]])},
        {"w": torch.tensor([5.0, 0.0, -2.0]), "b": torch.tensor([[-0.5]])},
    ]
    avg = mean_of(states)
    assert torch.equal(avg["w"], torch.tensor([3.0, 2.0, 2.0]))
    assert torch.equal(avg["b"], torch.tensor([[0.5]]))
    assert avg["w"].dtype == torch.float32


def test_sum_is_wider_than_the_stored_precision() -> None:
    # In bf16, 256 + 1 + 1 + ... rounds back to 256; a float64 sum does not.
    states = [{"x": torch.tensor([256.0], dtype=torch.bfloat16)}]
    states += [{"x": torch.tensor([1.0], dtype=torch.bfloat16)} for _ in range(7)]
    avg = mean_of(states)
    assert avg["x"].dtype == torch.float32  # written as float32, not bf16
    assert avg["x"].item() == (256.0 + 7.0) / 8
    # float32 values whose float32 running sum would round: 2^24 + 1 is not representable.
    big = [
        {"y": torch.tensor([16777216.0])},
        {"y": torch.tensor([1.0])},
        {"y": torch.tensor([1.0])},
    ]
    assert mean_of(big)["y"].item() == pytest.approx((16777216.0 + 2.0) / 3, abs=0)
    wide = mean_of([{"z": torch.tensor([1.0], dtype=torch.float64)}] * 2)
    assert wide["z"].dtype == torch.float64


def test_integer_buffers_are_not_averaged() -> None:
    states = [
        {"w": torch.tensor([0.0]), "count": torch.tensor([10]), "mask": torch.tensor([True])},
        {"w": torch.tensor([1.0]), "count": torch.tensor([13]), "mask": torch.tensor([False])},
    ]
    avg = mean_of(states, integers="last")
    assert avg["count"].tolist() == [13] and avg["count"].dtype == torch.int64
    assert avg["mask"].tolist() == [False]
    with pytest.raises(AveragingError, match="'count' differs"):
        mean_of(states, integers="equal")


def test_holds_only_the_running_sum() -> None:
    averager = StateAverager()
    for value in (1.0, 2.0, 6.0):
        state = {"w": torch.full((2, 2), value)}
        averager.add(state)
        del state
    assert averager.count == 3
    assert torch.equal(averager.result()["w"], torch.full((2, 2), 3.0))


def test_refusals_name_the_first_difference() -> None:
    base = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(AveragingError, match=r"'b' has shape \(3,\) vs \(4,\)"):
        mean_of([base, {"a": torch.zeros(2), "b": torch.zeros(4)}])
    with pytest.raises(AveragingError, match="'c' is missing from the first"):
        mean_of([base, {**base, "c": torch.zeros(1)}])
    with pytest.raises(AveragingError, match="'b' is missing from the second"):
        mean_of([base, {"a": torch.zeros(2)}])
    with pytest.raises(AveragingError, match="'a' has dtype"):
        mean_of([base, {**base, "a": torch.zeros(2, dtype=torch.long)}])
    with pytest.raises(AveragingError, match="nothing"):
        mean_of([])


def test_first_difference_of_configs() -> None:
    a = {"d_model": 512, "n_heads": 8, "d_ff": 2048}
    assert first_difference(a, dict(a)) is None
    assert first_difference(a, {**a, "n_heads": 16, "d_model": 1024}) == "d_model: 512 vs 1024"
    assert first_difference(a, {"d_model": 512, "n_heads": 8}) == "d_ff: 2048 vs missing"
