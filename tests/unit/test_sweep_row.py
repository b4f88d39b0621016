"""A sweep row's process: which GPU it gets, and how its failure comes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nmt_cli.config import load_recipe
from nmt_cli.engines.sweep_row import RowJob, cuda_devices_for, run_row_process
from nmt_cli.errors import NmtError

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_a_slot_indexes_the_mask_already_set() -> None:
    mask = "4,5,6,7"
    assert [cuda_devices_for(slot, 4, mask) for slot in range(4)] == ["4", "5", "6", "7"]
    assert cuda_devices_for(1, 2, "GPU-aaaa, GPU-bbbb") == "GPU-bbbb"  # UUIDs, spaces
    assert cuda_devices_for(0, 2, "4,5,6,7") == "4"  # the first `gpus` of a wider mask


def test_without_a_mask_a_slot_is_its_own_device() -> None:
    assert [cuda_devices_for(slot, 3, None) for slot in range(3)] == ["0", "1", "2"]


def test_more_jobs_than_gpus_share_them_in_turn() -> None:
    assert [cuda_devices_for(slot, 2, "6,7") for slot in range(4)] == ["6", "7", "6", "7"]


@pytest.mark.parametrize("mask", ["", "3", " , "])
def test_a_mask_with_too_few_gpus_is_refused(mask: str) -> None:
    with pytest.raises(NmtError, match="--gpus 2 asked for"):
        cuda_devices_for(0, 2, mask)


@pytest.mark.slow
def test_a_failing_row_reports_its_reason_in_one_line(tmp_path: Path) -> None:
    """The row's process fails as the engine does (no data directory): the parent gets the
    engine's message, no traceback, and the log has it too."""
    run_dir = tmp_path / "run"
    recipe = load_recipe(
        RECIPES / "demo.toml",
        [
            f"data.dir={json.dumps(str(tmp_path / 'nowhere'))}",
            f"train.run_dir={json.dumps(str(run_dir))}",
        ],
    )
    log = run_dir / "sweep.log"
    job = RowJob(recipe=recipe.to_dict(), source="test", log=str(log))
    reason = run_row_process(job)
    assert reason is not None
    assert "not a prepared data directory" in reason and reason.endswith(f"see {log}")
    assert "\n" not in reason and "Traceback" not in reason
    assert "error: " in log.read_text(encoding="utf-8")
