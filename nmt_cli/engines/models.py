"""One checkpoint or several, as the one searchable model `nmt translate` decodes.

Several checkpoints become an `Ensemble` (core/ensemble.py) after a check that they share
their vocabularies; one checkpoint stays one model (on a CPU, the CPU backend's wrapper of
its Transformer), so a single model pays
nothing for ensembling. Every member is built on the same device in the same precision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import torch
from torch import nn

from nmt_cli.backends.cpu import cpu_decoders
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.ensemble import Ensemble, Member, check_same_vocabularies
from nmt_cli.core.precision import DecodePrecision, dtype_of
from nmt_cli.core.vocab import VocabPair

__all__ = [
    "ModelPaths",
    "as_paths",
    "build_decoder",
    "load_checkpoints",
]

ModelPaths = str | Path | Sequence[str | Path]


def as_paths(paths: ModelPaths) -> list[Path]:
    """One path or several, as a list (a str is one path, not a sequence of letters)."""
    return [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]


def load_checkpoints(paths: ModelPaths) -> tuple[list[Checkpoint], list[str]]:
    """Checkpoints and the names errors use for them (the paths as given)."""
    files = as_paths(paths)
    if not files:
        raise ValueError("no checkpoint given")
    return [load_checkpoint(p) for p in files], [str(p) for p in files]


def build_decoder(
    checkpoints: Sequence[Checkpoint],
    names: Sequence[str],
    device: torch.device,
    precision: DecodePrecision,
    compiled_step: bool = False,
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> tuple[Member | Ensemble, VocabPair, list[str]]:
    """The model search decodes with, the vocabularies its ids belong to, and the plan
    of its operations in words, one line each (`--verbose`).

    On a CPU each model is wrapped by the CPU decoding backend (nmt_cli/backends/cpu),
    which chooses its arithmetic: packed bf16 or int8 linear layers, and with
    `compiled_step` the compiled module and its C++ step; `on_compile` is told how far a
    first, slow build of it has come (None: on stderr) and `on_fallback` the reason where
    a model decodes on the reference (Python) step instead. Elsewhere the Transformer is
    decoded as it is.
    """
    check_same_vocabularies([c.vocab for c in checkpoints], names)
    dtype = dtype_of(precision)
    planned = machine_plan(Target(device, training=False))
    built = [
        c.build_model(planned.operations).to(device=device, dtype=dtype).eval() for c in checkpoints
    ]
    members: list[nn.Module] = list(built)
    lines = planned.describe()
    if device.type == "cpu":
        decoders = cpu_decoders(built, precision, compiled_step, on_compile, on_fallback)
        for i, decoder in enumerate(decoders):
            member = f"model {i + 1}: " if len(decoders) > 1 else ""
            lines += [f"{member}{what}: {how}" for what, how in decoder.paths().items()]
        members = list(decoders)
    model = members[0] if len(members) == 1 else Ensemble(members).eval()
    return cast(Member | Ensemble, model), checkpoints[0].vocab, lines
