"""Which floating-point precision a device runs, for training and decoding alike.

bf16 is the default wherever the hardware multiplies in it natively (Ampere and later
GPUs; CPUs with bf16 units, AVX512_BF16 or AMX, where it is several times faster than
fp32). Elsewhere 'auto' falls back to fp16 on older GPUs and fp32 on CPUs: an AVX2-only or
plain AVX-512 CPU only emulates bf16, many times slower than fp32, and a bf16 asked for
there is told so once, with the slowdown measured on the spot (`bf16_emulation_warning`
of nmt_cli/cpu_level.py, which knows which CPU has what). Training runs the model in fp32
under autocast; decoding casts the weights themselves (`dtype_of`).

The names of the precisions are defined here once, for the recipe's settings (which may
say "auto") and for what a device resolves them to. Loading this module does not load
torch (the recipe's loader uses the names; `nmt --help` never loads torch).
"""

from __future__ import annotations

import contextlib
import typing
from typing import TYPE_CHECKING, Literal

from nmt_cli.cpu_level import has_bf16_units
from nmt_cli.errors import NmtError

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "bf16", "fp16"]  # what training runs in
DecodePrecision = Literal[Precision, "int8"]  # what decoding runs in: int8 on CPUs
PrecisionSetting = Literal["auto", Precision]  # train.precision: auto = resolve_precision
DecodePrecisionSetting = Literal["auto", DecodePrecision]  # decode.precision, --precision
DECODE_PRECISIONS: tuple[str, ...] = typing.get_args(DecodePrecisionSetting)


def resolve_precision(requested: str, device: torch.device, setting: str) -> Precision:
    """'auto' -> what the device runs natively; fp16 is refused off a GPU.

    `setting` names the option the user set (e.g. "--precision", "train.precision"), so
    the message points at the right place.
    """
    import torch

    if requested == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if has_bf16_units() else "fp32"
    if requested == "fp16" and device.type != "cuda":
        raise NmtError(f"{setting} fp16 needs a GPU; on a CPU use bf16 or fp32")
    if requested not in ("fp32", "bf16", "fp16"):
        raise NmtError(f"{setting} {requested!r}: use auto, fp32, bf16 or fp16")
    return requested  # type: ignore[return-value]


def resolve_decode_precision(requested: str, device: torch.device, setting: str) -> DecodePrecision:
    """`resolve_precision`, plus int8: quantized linear layers, which only CPUs run."""
    if requested == "int8":
        if device.type != "cpu":
            raise NmtError(f"{setting} int8 runs on CPUs; on a GPU use bf16 or fp16")
        return "int8"
    return resolve_precision(requested, device, setting)


def dtype_of(precision: DecodePrecision) -> torch.dtype:
    """The floating-point dtype the model is held in (int8 models keep float32 around
    their quantized matrices)."""
    import torch

    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "int8": torch.float32,
    }[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Mixed precision for a model kept in fp32 (training, validation); none for fp32."""
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype_of(precision))  # type: ignore[arg-type]
