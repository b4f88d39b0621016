"""What each rank builds before the training loop: checks, the objective, a description.

Kept apart from `loop.py` so that the loop reads as the procedure of section 5: model and
loss as one module (compiled and DDP-wrapped where that pays), checked against the data.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from nmt_cli.core.losses import LossSweep, smoothed_loss_sweep
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import PAD_ID
from nmt_cli.engines.train.device_choices import DeviceChoices
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.errors import NmtError

# What `train.compile` compiles with. Tests put a cheaper backend here ("eager": dynamo's
# graph capture without code generation, which takes minutes on a small CPU) or one
# that fails.
COMPILE_BACKEND = "inductor"


def check_positions(cfg: ModelConfig, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> None:
    """Refuse data whose longest sentence the model's positions cannot hold."""
    longest = int(max(src_lengths.max(initial=0), tgt_lengths.max(initial=0)))
    if longest + 1 > cfg.max_positions:
        raise NmtError(
            f"the training data has sentences of {longest} tokens but model.max_positions "
            f"is {cfg.max_positions}; raise model.max_positions or lower data.max_len"
        )


def training_objective(
    model: Transformer,
    label_smoothing: float,
    choices: DeviceChoices,
    ctx: DistContext,
    loss_sweep: LossSweep = smoothed_loss_sweep,
) -> torch.nn.Module:
    """Model and loss as one module (compiled where that pays), DDP-wrapped on many ranks."""
    objective: torch.nn.Module = TrainingObjective(
        model,
        label_smoothing,
        PAD_ID,
        fused_projection=choices.fused_projection,
        compile_backend=COMPILE_BACKEND if choices.compile_model else None,
        loss_sweep=loss_sweep,
    )
    if ctx.distributed:
        objective = DistributedDataParallel(
            objective,
            device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
            forward_sync_buffers=False,  # the only buffer is the fixed position table
            gradient_as_bucket_view=True,
        )
    return objective


def describe_device(ctx: DistContext) -> str:
    """What `nmt train` says it trains on."""
    if ctx.device.type == "cuda":
        name = torch.cuda.get_device_name(ctx.device)
        return f"{ctx.world} x {name} (nccl)" if ctx.distributed else name
    if ctx.distributed:
        return f"cpu, {ctx.world} processes (gloo)"
    return "cpu"
