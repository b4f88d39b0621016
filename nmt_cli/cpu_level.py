"""The CPU's instruction-set level, as far as nmt's choices care, and the switch that lowers it.

Three things depend on which vector instructions a CPU has: the precision `auto` picks
(bf16 only where the CPU has bf16 units: AVX512_BF16 or AMX; elsewhere it is emulated
and several times slower than fp32), which of the compiled module's kernels run (their
AVX-512 loops or their plain ones), and which paths PyTorch's own libraries take (oneDNN,
ATen's vectorized kernels). All three read the level from here, one ladder of levels,
each containing the ones below it:

    generic < avx2 < avx512 < avx512_vnni < avx512_bf16 < amx

`NMT_CPU_LEVEL=<level>` caps it: an AVX-512 or AMX machine then decides, decodes and
trains as a lower one would, so one machine tests every path. The cap also caps oneDNN
(`ONEDNN_MAX_CPU_ISA`), ATen (`ATEN_CPU_CAPABILITY`) and MKL (`MKL_ENABLE_INSTRUCTIONS`,
fp32 products), which read those variables once, when torch loads:
`apply_to_torch_environment` sets them, and importing nmt_cli calls it, so the `nmt`
command does before it imports torch. (fbgemm, PyTorch's int8 engine, reads the CPU
itself and ignores any cap.)

Loading this module does not load torch.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_cli.errors import UsageError

if TYPE_CHECKING:
    import torch

ENV = "NMT_CPU_LEVEL"
LEVELS: tuple[str, ...] = ("generic", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx")

# The Linux kernel's names of the flags each level adds to the one below it.
_ADDS: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "avx512_vnni": frozenset({"avx512_vnni"}),
    "avx512_bf16": frozenset({"avx512_bf16"}),
    "amx": frozenset({"amx_tile", "amx_bf16"}),
}

# What each level lets oneDNN and ATen use (their own names for the same ladder).
_ONEDNN_ISA = {
    "generic": "SSE41",
    "avx2": "AVX2",
    "avx512": "AVX512_CORE",
    "avx512_vnni": "AVX512_CORE_VNNI",
    "avx512_bf16": "AVX512_CORE_BF16",
    "amx": "AVX512_CORE_AMX",
}
_ATEN_CAPABILITY = {"generic": "default", "avx2": "avx2"}  # the rest: "avx512"
# MKL's int8 products (CTranslate2's on Intel CPUs) take VNNI only from AVX512_E1 on.
_MKL_INSTRUCTIONS = {"generic": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512"}  # the rest: E1

# The flags worth showing in a bug report: the ladder's, and the AVX2-class VNNI that int8
# products use where there is no AVX-512.
REPORTED_FLAGS: tuple[str, ...] = (*sorted(set().union(*_ADDS.values())), "avx_vnni")


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """One field of the kernel's description of the first CPU ("flags", "model name");
    empty where it cannot be read (another OS, a sandbox)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ""
    line = next((line for line in text.splitlines() if line.startswith(name)), "")
    return line.partition(":")[2].strip()


@cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags the kernel reports for the first CPU; none where they cannot be read:
    the safe answer, which makes the level generic."""
    return frozenset(cpuinfo_field("flags", cpuinfo).split())


def detected_level(flags: frozenset[str] | None = None) -> str:
    """The highest level whose flags, and those of every level below it, the CPU has."""
    if flags is None:
        flags = cpu_flags() if platform.machine() in ("x86_64", "AMD64") else frozenset()
    level = LEVELS[0]
    for name in LEVELS[1:]:
        if not _ADDS[name] <= flags:
            break
        level = name
    return level


def requested_cap() -> str | None:
    """The level `NMT_CPU_LEVEL` asks for, None when unset or empty."""
    value = os.environ.get(ENV, "").strip().lower()
    if not value:
        return None
    if value not in LEVELS:
        raise UsageError(f"{ENV}={value!r}: use one of {', '.join(LEVELS)}")
    return value


def cpu_level() -> str:
    """The level nmt runs at: the CPU's own, lowered to `NMT_CPU_LEVEL` where that is set."""
    detected, cap = detected_level(), requested_cap()
    if cap is None:
        return detected
    return min(detected, cap, key=LEVELS.index)


def at_least(level: str) -> bool:
    """Whether nmt may use the instructions of `level` here."""
    return LEVELS.index(cpu_level()) >= LEVELS.index(level)


def vector_width(level: int) -> str:
    """The vector instructions the module's float loops run at a level (an index into
    LEVELS, as the module reports its level in force): the kernels written once over lane
    traits take sixteen lanes from AVX-512 up, eight on AVX2 + FMA, none below."""
    if level >= LEVELS.index("avx512"):
        return "AVX-512"
    return "AVX2" if level >= LEVELS.index("avx2") else "none"


def has_bf16_units() -> bool:
    """bf16 products run in hardware (AVX512_BF16 or AMX): where `auto` picks bf16."""
    return at_least("avx512_bf16")


def bf16_emulation_warning(precision: str, device: torch.device, setting: str) -> str | None:
    """What to tell a user who asked for bf16 on a CPU without bf16 units: that it is
    emulated, how much slower than fp32 a matrix product of a training step's size ran
    here just now (the figure is this machine's, not a table's), and what to use instead.
    None where bf16 runs in hardware or was not asked for."""
    if precision != "bf16" or device.type != "cpu" or has_bf16_units():
        return None
    slowdown = _bf16_slowdown()
    return (
        f"{setting} bf16: this CPU ({cpu_level()}) has no bf16 units (AVX512_BF16 or AMX), "
        f"so bf16 is emulated: a matrix product took {slowdown:.1f}x the time of fp32 here; "
        'use precision "auto" (fp32 on this CPU) or "fp32"'
    )


def _bf16_slowdown(size: int = 384, repeats: int = 3) -> float:
    """bf16 time over fp32 time of a (size x size) product, best of `repeats` (~0.1 s)."""
    import time

    import torch

    def best(dtype: torch.dtype) -> float:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        a @ b  # the first call may build a kernel
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.bfloat16) / max(best(torch.float32), 1e-9)


def torch_environment(level: str) -> dict[str, str]:
    """The variables that cap oneDNN, ATen and MKL (fp32 products) at `level`."""
    return {
        "ONEDNN_MAX_CPU_ISA": _ONEDNN_ISA[level],
        "ATEN_CPU_CAPABILITY": _ATEN_CAPABILITY.get(level, "avx512"),
        "MKL_ENABLE_INSTRUCTIONS": _MKL_INSTRUCTIONS.get(level, "AVX512_E1"),
    }


def apply_to_torch_environment() -> None:
    """Cap oneDNN, ATen and MKL as `NMT_CPU_LEVEL` asks (variables already set win). Only
    effective before torch is imported: both read their variable once, when it loads.
    A value that names no level is left for `cpu_level` to report, as a usage error."""
    try:
        cap = requested_cap()
    except UsageError:
        return
    if cap is None:
        return
    for key, value in torch_environment(cap).items():
        os.environ.setdefault(key, value)
