"""The GPU check script without a GPU: its dry run (GPU_CHECK_DRY=1) runs every stage's
command on the CPU with tiny settings, on raw Multi30k-shaped files it prepares itself
(bench/gpu_train.py, gpu_decode.py, run_figures.py and profile_train.py included); stages past the
deadline are skipped and fail the check; its stage limits fit its deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unix_helpers import corpus_pairs, write_lines

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
# The script's stages, in its order; each one must run and pass in the dry run.
STAGES = [
    "environment",
    "prepare",
    "train-speed",
    "multi30k",
    "multi30k-figures",
    "decode-speed",
    "host-time",
    "train-fp16",
    "torchrun",
    "gpus-error",
]

# A GPU machine's python may lack these (torch, numpy, typer, rich, sentencepiece and
# sacrebleu only); nothing the check runs may need them.
BLOCKER = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sacremoses", "datasets", "matplotlib", "tensorboard"):
            raise ImportError(name + " is not installed here")
        return None
sys.meta_path.insert(0, _Block())
"""


def _raw_multi30k(root: Path) -> Path:
    """Small files named as multi30k/dataset names them: what `--from DIR` reads."""
    root.mkdir(parents=True)
    offset = 0
    for split, n in (("train", 300), ("val", 20), ("test_2016_flickr", 20)):
        items = corpus_pairs(n, offset)
        offset += n
        write_lines(root / f"{split}.en.gz", [a for a, _ in items], gz=True)
        write_lines(root / f"{split}.de.gz", [b for _, b in items], gz=True)
    return root


def _run_check(
    tmp_path: Path, data: Path, seconds: int = 540, dry: bool = False
) -> subprocess.CompletedProcess[str]:
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PYTHONPATH=str(block),
        GPU_CHECK_SECONDS=str(seconds),
        GPU_CHECK_DRY="1" if dry else "0",
        OMP_NUM_THREADS="1",  # a shared CPU: one thread a process, no oversubscription
        LOGLEVEL="WARNING",  # torchrun's
        TMPDIR=str(tmp_path),  # the script's prepared data and checkpoints
    )
    env.pop("OUT", None)
    out = tmp_path / "out"
    return subprocess.run(
        ["bash", str(SCRIPT), str(data), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_on_the_cpu_from_raw_files(tmp_path: Path) -> None:
    done = _run_check(tmp_path, _raw_multi30k(tmp_path / "raw"), dry=True)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "DRY RUN (GPU_CHECK_DRY=1)" in text
    ran = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert ran == STAGES, text
    for name in STAGES:
        assert f"-- {name}: done in " in done.stdout, (name, text)
    assert "all stages ran" in done.stdout
    # the figures each stage exists for, measured rates only
    assert "bf16 matmul (256^3) measured:" in done.stdout
    for variant in ("eager bf16", "baseline bf16", "eager fp16"):
        assert f"tiny {variant}: 2 steps" in done.stdout, variant
    assert done.stdout.count("of the measured matmul rate") == 3
    assert "of peak" not in text and "TFLOP/s peak" not in text
    assert "3 updates in " in done.stdout  # run_figures.py read the Multi30k run
    assert "beam 4, batch 128, cpu:" in done.stdout and "(16 sentences)" in done.stdout
    assert "beam 4, batch 1, cpu:" in done.stdout and "(3 sentences)" in done.stdout
    assert "host time outside the model's forward, loss, backward and optimizer" in done.stdout
    assert "error: --gpus " in done.stdout and "(the expected one-line error, exit 1)" in text
    out = tmp_path / "out"
    summary = (out / "SUMMARY.txt").read_text(encoding="utf-8")
    assert all(f"-- {name}: done" in summary for name in STAGES)
    assert sorted(out.glob("*.log")) == sorted(out / f"{name}.log" for name in STAGES)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {s["system"] for s in results["systems"]} >= {"last"}
    assert (out / "metrics.jsonl").is_file()


def test_stages_past_the_deadline_are_skipped_and_what_cannot_run_is_said(
    tmp_path: Path,
) -> None:
    """Past the deadline every stage is skipped, and so the GPUs are not counted; data
    that is not there, and the GPU stages that cannot run, are said and fail the check."""
    done = _run_check(tmp_path, tmp_path / "missing", seconds=10)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "== environment: SKIPPED, the check's 10s are spent" in done.stdout
    assert "== data: no Multi30k at" in done.stdout
    assert "did not count the GPUs: skipping the GPU stages" in done.stdout
    assert "GPU_CHECK_DRY=1" in done.stdout
    assert "failed, timed out or skipped: environment data" in done.stdout
    summary = (tmp_path / "out" / "SUMMARY.txt").read_text(encoding="utf-8")
    assert "skipping the GPU stages" in summary


def test_the_stage_limits_fit_the_deadline_with_margin() -> None:
    """The limits the script gives its stages add up to at most 90% of its deadline (the
    rest is start-up and the kill grace of a stage that times out), and the header
    states them."""
    text = SCRIPT.read_text(encoding="utf-8")
    limits = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) > 2 and words[0] == "stage" and words[2].isdigit():
            limits[words[1]] = int(words[2])
    assert list(limits) == STAGES
    deadline = int(text.split("GPU_CHECK_SECONDS:-")[1].split("}")[0])
    assert sum(limits.values()) <= 0.9 * deadline
    stated = ", ".join(f"{name} {limit}" for name, limit in limits.items())
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert f"{stated}; {sum(limits.values())} in all" in " ".join(header.split())
