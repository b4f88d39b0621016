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

from nmt_cli.backends.cpu import CpuDecoder, cpu_decoders
from nmt_cli.backends.cpu.decoder import decoding_kernel
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Plan, Target
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.ensemble import Ensemble, Member, check_same_vocabularies
from nmt_cli.core.operations import Operations
from nmt_cli.core.precision import DecodePrecision, dtype_of
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair

__all__ = [
    "ModelPaths",
    "as_paths",
    "build_decoder",
    "decoding_models",
    "describe",
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
    of its operations in words, one line each (`--verbose`): `decoding_models` of the
    checkpoints, as one model or their ensemble."""
    check_same_vocabularies([c.vocab for c in checkpoints], names)
    builders = [c.build_model for c in checkpoints]
    members, planned = decoding_models(
        builders, device, precision, compiled_step, on_compile, on_fallback
    )
    model = members[0] if len(members) == 1 else Ensemble(members).eval()
    return cast(Member | Ensemble, model), checkpoints[0].vocab, describe(planned, members)


def decoding_models(
    builders: Sequence[Callable[[Operations], Transformer]],
    device: torch.device,
    precision: DecodePrecision,
    compiled_step: bool = False,
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> tuple[list[nn.Module], Plan]:
    """Each model built as planned for decoding on `device` in `precision` (a builder
    gives a model with its weights for the plan's operations, as `Checkpoint.build_model`
    does), and the plan.

    On a CPU the plan's linear layers may be the CPU backend's packed bf16 or int8 ones,
    on the compiled module's kernels (with `compiled_step`: `on_compile` is told how far
    a first, slow build of it has come, None: on stderr), and each model is wrapped by
    the backend (nmt_cli/backends/cpu), which chooses the rest of its arithmetic;
    `on_fallback` gets the reason where a model decodes on the reference (Python) step.
    Elsewhere the Transformer is decoded as it is.
    """
    cpu = device.type == "cpu"
    kernel, no_kernel = (
        decoding_kernel(compiled_step, on_compile, on_fallback) if cpu else (None, "not a CPU")
    )
    target = Target(device, False, kernel=kernel, no_kernel=no_kernel, precision=precision)
    planned = machine_plan(target)
    dtype = dtype_of(precision)
    built = [build(planned.operations).to(device=device, dtype=dtype).eval() for build in builders]
    if not cpu:
        return list(built), planned
    decoders = cpu_decoders(built, planned.operations.linear, kernel, precision, on_fallback)
    return list(decoders), planned


def describe(planned: Plan, members: Sequence[nn.Module]) -> list[str]:
    """The plan in words, then what each CPU backend's model decodes its step with."""
    lines = planned.describe()
    for i, member in enumerate(members):
        if isinstance(member, CpuDecoder):
            which = f"model {i + 1}: " if len(members) > 1 else ""
            lines += [f"{which}{what}: {how}" for what, how in member.paths().items()]
    return lines
