"""What a `Translator` is loaded with: decoding settings, device, CPU threads.

Kept apart from the class so that `Translator.load` (the API's and the command's way in)
reads as what it does: settings, threads, checkpoints, model.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from nmt_cli.config import DecodeConfig
from nmt_cli.cpus import usable_cpus
from nmt_cli.errors import NmtError, UsageError


def decode_config(config: DecodeConfig | None, options: dict[str, Any]) -> DecodeConfig:
    """`config` (default: the paper's settings) with `options`, DecodeConfig fields, over it;
    an option that is not a field is a TypeError, as a wrong keyword is."""
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(DecodeConfig)})
    if unknown:
        raise TypeError(f"unknown decoding option(s): {', '.join(unknown)}")
    return dataclasses.replace(config or DecodeConfig(), **options)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r}: not a device (use cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"--device {name}: no CUDA device is available; use --device cpu")
    return device


def set_threads(threads: int, workers: int = 0) -> tuple[int, int]:
    """Spend `threads` CPU threads (0 = every CPU this process may use, within its affinity
    mask and cgroup quota: see nmt_cli/cpus.py) on `workers`
    batches decoded side by side (0 = one per thread); returns (threads, workers).

    Beam search runs many small matrix products, and on small or shared CPUs splitting
    each of them over several cores costs more in synchronisation than it gains (2 threads
    on one batch were several times slower than 1 on the 2-core benchmark machine), so by
    default every thread decodes its own batch with single-threaded operations.
    """
    n = threads if threads > 0 else usable_cpus()
    w = max(1, min(workers or n, n))
    torch.set_num_threads(max(1, n // w))
    return n, w


def warn_fallback(reason: str) -> None:
    """The API's default report of a model decoded without the compiled step (it could
    not be built here, or the model has settings it does not implement)."""
    warnings.warn(
        f"nmt: decoding with the Python step: {reason}",
        RuntimeWarning,
        stacklevel=3,
    )
