"""`nmt train` on several nodes as users start it: two torchrun agents on this machine
(two "nodes" of one process each), c10d rendezvous on the loopback address, gloo."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.train import TrainResult

pytestmark = pytest.mark.slow  # trains under torchrun, on two nodes

ENTRY = Path(__file__).with_name("torchrun_train.py")


def _recipe(path: Path, data: Path, run: Path) -> Path:
    path.write_text(
        f"""name = "tiny"
[data]
dir = "{data}"
[model]
encoder_layers = 1
decoder_layers = 1
d_model = 32
d_ff = 64
n_heads = 4
dropout = 0.1
max_positions = 64
[train]
run_dir = "{run}"
batch_tokens = 240
max_tokens = 200
warmup_steps = 4
max_steps = 4
save_interval_minutes = 0.0
save_interval_steps = 0
log_interval_steps = 1
keep_last = 2
precision = "fp32"
threads = 1
""",
        encoding="utf-8",
    )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_torchrun_nodes_end_with_the_weights_of_one_process(
    data: Path, accumulating_run: TrainResult, tmp_path: Path
) -> None:
    """Both ranks end with identical weights (exactly: DDP gives every rank the same
    averaged gradient), equal to one process accumulating the same two passes an update
    (ACCUMULATING's settings, which the recipe below writes out) within rtol 1e-5, atol
    1e-6 (the sum of gradients runs in another order)."""
    recipe = _recipe(tmp_path / "tiny.toml", data, tmp_path / "two")
    weights = tmp_path / "weights"
    weights.mkdir()
    node = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"),
        *("--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "nmt-test"),
        *("--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--local-addr", "127.0.0.1"),
        *("--rdzv-conf", "join_timeout=60", "--max-restarts", "0"),
        *(str(ENTRY), str(weights), "train", str(recipe), "-q"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
    nodes = [
        subprocess.Popen(
            node,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a timeout stops each agent with its worker
        )
        for _ in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=150)[0] for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for proc, output in zip(nodes, outputs, strict=True):
        assert proc.returncode == 0, output
    ranks = [torch.load(weights / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    two = load_checkpoint(tmp_path / "two/checkpoints/last.pt")
    assert two.step == 4 and two.train_state is not None
    assert (two.train_state["split"]["world"], two.train_state["split"]["accum"]) == (2, 1)

    single = load_checkpoint(accumulating_run.run_dir / "checkpoints/last.pt")
    assert single.train_state is not None
    assert (single.train_state["split"]["world"], single.train_state["split"]["accum"]) == (1, 2)
    assert ranks[0].keys() == ranks[1].keys() == single.model.keys()
    for key, value in single.model.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), key
        assert torch.equal(two.model[key], ranks[0][key]), key
        torch.testing.assert_close(ranks[0][key], value, rtol=1e-5, atol=1e-6)
