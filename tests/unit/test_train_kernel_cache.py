"""Training gives oneDNN's kernel cache room for every batch shape of an epoch
(engines/train/kernel_cache.py): shapes met again reuse their kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nmt_cli.engines.train.kernel_cache import (
    CAPACITY_VARIABLE,
    TRAINING_CAPACITY,
    widen_kernel_cache,
)

# 1,100 shapes, more than oneDNN's default cache holds, met twice in the same order as an
# epoch's batches are: the kernels oneDNN builds ("cache_miss") in each round.
PROGRAM = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "widened":
        from nmt_cli.engines.train.kernel_cache import widen_kernel_cache
        widen_kernel_cache()
    import torch
    weight = torch.randn(64, 64, dtype=torch.bfloat16)
    for round in range(2):
        print("round", round, flush=True)
        for rows in range(2, 1102):
            torch.randn(rows, 64, dtype=torch.bfloat16) @ weight
    """
)


def built_per_round(mode: str) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != CAPACITY_VARIABLE}
    env["ONEDNN_VERBOSE"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True, env=env
    )
    built = [0, 0]
    at = 0
    for line in done.stdout.splitlines():
        if line.startswith("round"):
            at = int(line.split()[1])
        elif "create:cache_miss" in line:
            built[at] += 1
    return built


@pytest.mark.slow
def test_an_epochs_shapes_met_again_build_no_kernels_once_widened() -> None:
    default = built_per_round("default")
    if default[0] < 1000:
        pytest.skip("bf16 products do not run through oneDNN on this CPU")
    assert default[1] > 1000  # the default cache has lost the first shapes by their turn
    assert built_per_round("widened") == [default[0], 0]


def test_a_capacity_the_user_chose_stays() -> None:
    environ = {CAPACITY_VARIABLE: "512"}
    widen_kernel_cache(environ)
    assert environ == {CAPACITY_VARIABLE: "512"}
    environ = {}
    widen_kernel_cache(environ)
    assert environ == {CAPACITY_VARIABLE: str(TRAINING_CAPACITY)}


def test_training_widens_the_cache_before_its_first_product(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from nmt_cli.config import RecipeConfig
    from nmt_cli.engines.train import loop

    monkeypatch.setenv(CAPACITY_VARIABLE, "0")  # so that the test's end restores it
    monkeypatch.delenv(CAPACITY_VARIABLE)
    seen: list[str | None] = []

    def first_step(*args: object) -> None:
        seen.append(os.environ.get(CAPACITY_VARIABLE))
        raise RuntimeError("stop here")

    monkeypatch.setattr(loop, "check_devices", first_step)
    with pytest.raises(RuntimeError, match="stop here"):
        loop.train(RecipeConfig(), loop.TrainOptions(run_dir=str(tmp_path)))
    assert seen == [str(TRAINING_CAPACITY)]
