"""Data-parallel training over gloo on the CPU: the distributed path, tested without GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.train import TrainOptions, TrainResult, train
from nmt_cli.engines.train.distributed import LaunchSpec, launch
from tests.fixtures.train_data import ACCUMULATING, ddp_update_worker, tiny_recipe

pytestmark = pytest.mark.slow  # spawns gloo ranks that train


@pytest.mark.parametrize("fused_projection", [False, True])
def test_two_process_update_equals_one_process_with_twice_the_batch(
    fused_projection: bool,
) -> None:
    """Two ranks with 2 and 3 sentences make the same update as one process with all
    5: the loss is normalised by the whole update's target tokens, not per rank. With the
    GPU's fused projection too: the tied weight's gradient from the loss reaches DDP."""
    spec = LaunchSpec(procs=2, timeout_s=60)
    max_diff = launch(spec, ddp_update_worker, (fused_projection,))
    assert max_diff < 1e-6


def test_two_gloo_ranks_train_like_one_process_accumulating(
    data: Path, accumulating_run: TrainResult, tmp_path: Path
) -> None:
    """The same recipe (240 real tokens an update, at most 200 padded tokens a pass) on 2
    processes x 1 pass and on 1 process x 2 accumulated passes: same batches, same
    dropout masks, same weights, and the same dev loss from two halves of the dev set."""
    one = accumulating_run
    two = train(
        tiny_recipe(data, tmp_path / "two", **ACCUMULATING),
        TrainOptions(procs=2, dist_timeout_s=60),
    )
    assert two.steps == one.steps == 4
    a = load_checkpoint(one.run_dir / "checkpoints/last.pt")
    b = load_checkpoint(two.run_dir / "checkpoints/last.pt")
    assert a.train_state is not None and b.train_state is not None
    split_one, split_two = a.train_state["split"], b.train_state["split"]
    assert (split_one["world"], split_one["accum"]) == (1, 2)
    assert (split_two["world"], split_two["accum"]) == (2, 1)
    assert split_one["max_tokens"] == split_two["max_tokens"]
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=1e-5, atol=1e-6)
    # each rank validated half the dev set; the sums add up to the whole set's loss
    assert one.final_dev_loss is not None
    assert two.final_dev_loss == pytest.approx(one.final_dev_loss, rel=1e-5)
