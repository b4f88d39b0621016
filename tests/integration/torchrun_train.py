"""`nmt train` as torchrun starts it in every rank, each rank also keeping its weights.

    torchrun ... tests/integration/torchrun_train.py WEIGHTS_DIR train RECIPE [OPTIONS]

runs the CLI's `nmt train` unchanged and, when a rank's training loop ends, saves that
rank's weights as WEIGHTS_DIR/rank{RANK}.pt: only rank 0 writes checkpoints, and
tests/integration/test_torchrun.py compares every rank's weights.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from nmt_cli.cli import main
from nmt_cli.core.checkpoint import model_state
from nmt_cli.engines.train import loop

_loop = loop._Trainer.loop


def _loop_and_keep_weights(self: loop._Trainer) -> str:
    stopped = _loop(self)
    weights = Path(os.environ["NMT_TEST_WEIGHTS"])
    torch.save(model_state(self.model), weights / f"rank{os.environ['RANK']}.pt")
    return stopped


if __name__ == "__main__":
    os.environ["NMT_TEST_WEIGHTS"] = sys.argv.pop(1)
    loop._Trainer.loop = _loop_and_keep_weights  # type: ignore[method-assign]
    main()
