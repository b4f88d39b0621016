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

from nmt_cli.backends.cpu import beam_advance, cpu_decoders, decoder_shape_free_rows
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.ensemble import Ensemble, Member, check_same_vocabularies
from nmt_cli.core.precision import DecodePrecision, dtype_of
from nmt_cli.core.vocab import VocabPair

__all__ = [
    "ModelPaths",
    "as_paths",
    "beam_advance",
    "build_decoder",
    "decoder_shape_free_rows",
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
) -> tuple[Member | Ensemble, VocabPair]:
    """The model search decodes with, and the vocabularies its ids belong to.

    On a CPU each model is wrapped by the CPU decoding backend (nmt_cli/backends/cpu),
    which chooses its arithmetic: packed bf16 or int8 linear layers, and with
    `compiled_step` the compiled module and its C++ step; `on_compile` is told how far a
    first, slow build of it has come (None: on stderr) and `on_fallback` the reason where
    a model decodes on the reference (Python) step instead. Elsewhere the Transformer is
    decoded as it is.
    """
    check_same_vocabularies([c.vocab for c in checkpoints], names)
    dtype = dtype_of(precision)
    built = [c.build_model().to(device=device, dtype=dtype).eval() for c in checkpoints]
    members: list[nn.Module] = list(built)
    if device.type == "cpu":
        members = list(cpu_decoders(built, precision, compiled_step, on_compile, on_fallback))
    model = members[0] if len(members) == 1 else Ensemble(members).eval()
    return cast(Member | Ensemble, model), checkpoints[0].vocab
