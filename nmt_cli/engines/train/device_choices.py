"""How training runs on its device: the GPU speed-ups and the CPU paths they leave alone.

A base model's step leaves a GPU idle most of the time and spends much of the rest
outside the matrix products (BENCHMARKS.md, "GPU"): cuDNN attention builds a graph for
every new batch shape, the label-smoothed loss makes several fp32 passes over the
(tokens x vocabulary) logits, and casts take GPU time of their own. On a GPU, therefore:

- attention kernels without per-shape cost (`backends/pytorch.py`);
- the output projection fused into the chunked loss (`core/objective.py`);
- batch widths padded to multiples of 8, so shapes repeat (`core/batching.py`);
- `torch.compile` of the model with dynamic shapes, unless the recipe turns it off;
- the next update's batches collated (in a worker thread) and copied while the device
  works on this one.

On a CPU none of these pays (the written-out attention, the cache-sized loss chunks and
eager mode are faster there, see BENCHMARKS.md), and `train.compile = "auto"` is off.
Each choice is a recipe setting whose "auto" means "by device" (`train.compile`,
`fused_projection`, `shape_multiple`, `prefetch`, `attention_backend`): set on a CPU, it
runs the GPU's code there, which is how the tests check the GPU's path without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from nmt_cli.backends.pytorch import AttentionBackend
from nmt_cli.config import TrainConfig

GPU_SHAPE_MULTIPLE = 8


@dataclass(frozen=True)
class DeviceChoices:
    compile_model: bool
    fused_projection: bool
    shape_multiple: int  # batch widths rounded up to a multiple of this
    attention_backend: AttentionBackend
    prefetch: bool  # prepare the next update's batches while the device works

    def describe(self) -> str:
        parts = [
            "torch.compile " + ("on (dynamic shapes)" if self.compile_model else "off"),
            f"attention kernels: {self.attention_backend}",
        ]
        if self.fused_projection:
            parts.append("output projection fused into the chunked loss")
        if self.shape_multiple > 1:
            parts.append(f"batch widths padded to multiples of {self.shape_multiple}")
        if self.prefetch:
            parts.append("next batches prepared ahead")
        return "; ".join(parts)


def choose(train: TrainConfig, device: torch.device) -> DeviceChoices:
    gpu = device.type == "cuda"
    multiple = train.shape_multiple
    return DeviceChoices(
        compile_model=resolve_compile(train.compile, device),
        fused_projection=gpu if train.fused_projection == "auto" else train.fused_projection,
        shape_multiple=(GPU_SHAPE_MULTIPLE if gpu else 1) if multiple == "auto" else multiple,
        attention_backend=train.attention_backend,
        prefetch=gpu if train.prefetch == "auto" else train.prefetch,
    )


def announcement(choices: DeviceChoices, device: torch.device) -> str | None:
    """What `nmt train` says at start about its choices: always on a GPU, and on a CPU
    when the recipe forced any away from the CPU's own."""
    if device.type == "cuda":
        return f"GPU training: {choices.describe()}"
    if choices != choose(TrainConfig(), device):
        return f"CPU training with GPU choices forced by the recipe: {choices.describe()}"
    return None


def resolve_compile(setting: bool | Literal["auto"], device: torch.device) -> bool:
    """'auto' compiles on GPUs only: on a CPU a compiled training step is slower than
    eager, after more than a minute of compilation (BENCHMARKS.md)."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)
