"""One checkpoint or several, as the one searchable model `nmt translate` decodes.

Several checkpoints become an `Ensemble` (core/ensemble.py) after a check that they share
their vocabularies; one checkpoint stays a plain Transformer, so a single model pays
nothing for ensembling. Every member is built on the same device in the same precision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.compiled_step import (
    CompileError,
    attach_compiled_steps,
    beam_advance,
    prepare_kernel,
)
from nmt_cli.core.decode_linear import LinearKind, specialise_linears
from nmt_cli.core.ensemble import Ensemble, check_same_vocabularies
from nmt_cli.core.precision import DecodePrecision, dtype_of
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair

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
    on_compile: Callable[[], None] = lambda: None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> tuple[Transformer | Ensemble, VocabPair]:
    """The model search decodes with, and the vocabularies its ids belong to.

    On a CPU, bf16 models get their linear layers packed once for oneDNN and int8
    models get quantized ones (core/decode_linear.py): decode-only models either way.
    With `compiled_step`, CPU models also get the C++ decoder step
    (core/compiled_step.py); `on_compile` is called before a first, slow build of it and
    `on_fallback` with the reason if it cannot be built (decoding then stays in Python).
    """
    check_same_vocabularies([c.vocab for c in checkpoints], names)
    dtype = dtype_of(precision)
    built = [c.build_model().to(device=device, dtype=dtype).eval() for c in checkpoints]
    kernel = None
    if compiled_step and device.type == "cpu":
        try:
            kernel = prepare_kernel(on_compile)
        except CompileError as exc:
            on_fallback(str(exc))
    if device.type == "cpu" and precision in ("bf16", "int8"):
        kind: LinearKind = "int8" if precision == "int8" else "packed-bf16"
        for member in built:
            specialise_linears(member, kind, kernel)
    if kernel is not None:
        attach_compiled_steps(built, kernel)
    model: Transformer | Ensemble = built[0] if len(built) == 1 else Ensemble(built).eval()
    return model, checkpoints[0].vocab
