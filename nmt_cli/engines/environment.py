"""What `nmt env` reports: the facts a bug report needs about this machine and install.

Every answer is read from the code that decides it, never re-derived: the precision from
`resolve_precision`, the CPU's level from nmt_cli/cpu_level.py, the decoding paths from
`decoding_models` run on a tiny model in each precision, the training paths from the
planner (backends/plan.py) and the module's own report of which loops its kernels run.
So the report cannot say one thing while `nmt translate` or `nmt train` does another.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import cast

import torch

from nmt_cli.backends.cpu import CpuDecoder
from nmt_cli.backends.cpu.build import CompileError, build_directory, is_built, prepare_kernel
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.core.checkpoint import build_transformer
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.precision import DecodePrecision, resolve_decode_precision
from nmt_cli.core.transformer import Transformer
from nmt_cli.cpu_level import (
    ENV,
    LEVELS,
    REPORTED_FLAGS,
    cpu_flags,
    cpu_level,
    cpuinfo_field,
    detected_level,
    has_bf16_units,
    vector_width,
)
from nmt_cli.cpus import usable_cpus
from nmt_cli.engines.models import decoding_models
from nmt_cli.version import __version__


@dataclass(frozen=True)
class Section:
    """A titled list of (what, answer) rows."""

    title: str
    rows: tuple[tuple[str, str], ...]


def describe_environment(build: bool = False) -> list[Section]:
    """The report; `build` builds the compiled module first if it is missing (without it,
    the decoding and training paths are those of a machine where it is not built yet)."""
    kernel, kernel_note = _kernel(build)
    sections = [
        Section(
            "nmt",
            (
                ("version", __version__),
                ("python", f"{platform.python_version()} ({sys.executable})"),
                ("platform", platform.platform()),
            ),
        ),
        _torch_section(),
        _cpu_section(),
        _precision_section(),
        Section("compiled CPU module", (("state", kernel_note), ("directory", _directory()))),
    ]
    sections.extend(_decoding_sections())
    sections.append(_training_section(kernel, kernel_note))
    return sections


def _training_section(kernel: ModuleType | None, state: str) -> Section:
    """The planner's choice for training on this CPU, and the loops the module's
    training kernels run at this CPU level."""
    target = Target(torch.device("cpu"), True, kernel=kernel, no_kernel=f"the module is {state}")
    rows = [tuple(line.split(": ", 1)) for line in machine_plan(target).describe()]
    if kernel is not None:
        vectorized = kernel.vectorized()
        names = ("attention_train", "bias_relu", "dropout_mask", "smoothed_loss")
        loops = [name for name in names if vectorized[name]]
        width = vector_width(kernel.cpu_level())
        rows.append(
            ("vector loops", f"{', '.join(loops)} ({width})" if loops else "none (plain loops)")
        )
    return Section("training on the CPU", tuple((what, answer) for what, answer in rows))


def _kernel(build: bool) -> tuple[ModuleType | None, str]:
    """The module where it is here (built first with `build`), and its state in words."""
    try:
        if build or is_built():
            return prepare_kernel(), "built and loaded"
    except CompileError as exc:
        return None, f"cannot be built here: {exc}"
    return (
        None,
        "not built yet (the first command that decodes or trains builds it; or nmt env --build)",
    )


def _directory() -> str:
    try:
        return str(build_directory())
    except OSError as exc:
        return f"unreadable sources: {exc}"


def _torch_section() -> Section:
    rows = [
        ("version", torch.__version__),
        ("CUDA", torch.version.cuda or "none (a CPU build)"),
        ("ATen CPU capability", torch.backends.cpu.get_cpu_capability()),
        ("oneDNN", "available" if torch.backends.mkldnn.is_available() else "missing"),
        ("quantized engines", ", ".join(torch.backends.quantized.supported_engines)),
        ("threads", str(torch.get_num_threads())),
    ]
    for var in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"):
        if os.environ.get(var):
            rows.append((var, os.environ[var]))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(index)
            rows.append((f"GPU {index}", name))
    return Section("torch", tuple(rows))


def _cpu_model() -> str:
    return cpuinfo_field("model name") or platform.processor() or "unknown"


def _cpu_section() -> Section:
    flags = cpu_flags()
    has = [flag for flag in REPORTED_FLAGS if flag in flags]
    lacks = [flag for flag in REPORTED_FLAGS if flag not in flags]
    cap = os.environ.get(ENV) or "unset"
    return Section(
        "CPU",
        (
            ("model", _cpu_model()),
            ("usable cores", str(usable_cpus())),
            ("flags", " ".join(has) or "none of those nmt asks about"),
            ("lacks", " ".join(lacks) or "none"),
            ("detected level", f"{detected_level()} (of {', '.join(LEVELS)})"),
            (ENV, cap),
            ("level in force", cpu_level()),
        ),
    )


def _precision_section() -> Section:
    cpu = torch.device("cpu")
    rows = [
        ("auto on the CPU", resolve_decode_precision("auto", cpu, "auto")),
        ("bf16 on the CPU", "in hardware" if has_bf16_units() else "emulated (slow)"),
    ]
    if torch.cuda.is_available():
        rows.append(("auto on the GPU", resolve_decode_precision("auto", torch.device("cuda"), "")))
    return Section("precision", tuple(rows))


def _decoding_sections() -> list[Section]:
    """`decoding_models`' choice for a tiny model in each precision, as it would decide for
    a checkpoint of any size (the choice depends on the settings, not on the sizes): the
    planner's linear layers, then the CPU backend's step."""
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, n_heads=2,
        src_vocab_size=32, tgt_vocab_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    weights = Transformer(cfg).state_dict()
    sections = []
    for precision in ("fp32", "bf16", "int8"):
        notes: list[str] = []
        [decoder], planned = decoding_models(
            [partial(build_transformer, cfg, weights)],
            torch.device("cpu"),
            cast(DecodePrecision, precision),
            is_built(),
            on_fallback=notes.append,
        )
        rows = [("linear", planned.choice("linear").describe())]
        rows += list(cast(CpuDecoder, decoder).paths().items())
        rows += [("note", note) for note in notes]
        sections.append(Section(f"decoding on the CPU in {precision}", tuple(rows)))
    return sections
