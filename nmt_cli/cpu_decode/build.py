"""Building and loading the compiled module of the CPU decoding backend (csrc/).

The module holds the decoder step as one C++ call (csrc/decoder_step.cpp, used by
cpu_decode/step.py) and the kernels both steps use: bf16 and int8 products for the few
rows of a step (csrc/bf16_linear.cpp, csrc/int8_linear.cpp, through cpu_decode/linear.py),
attention over the SlotCache (csrc/attention.cpp), a log-softmax (csrc/log_softmax.cpp)
and beam search's bookkeeping with its one-pass candidate selection (csrc/beam_topk.cpp);
and, for training on a CPU, dropout's masks (csrc/dropout_mask.cpp) and the smoothed
loss's sweep over the logits (csrc/smoothed_loss.cpp), through engines/train/cpu_kernels.py.

It is built with PyTorch's extension builder (a C++ compiler and ninja) once per source
text, source directory and PyTorch version, into a per-user cache
(`TORCH_EXTENSIONS_DIR` if set); where that fails, decoding keeps the Python step and the
caller is told why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sysconfig
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

_CSRC = Path(__file__).with_name("csrc")
_NAMES = (
    "decoder_step",
    "bf16_linear",
    "int8_linear",
    "beam_topk",
    "log_softmax",
    "attention",
    "dropout_mask",
    "smoothed_loss",
    "attention_train",
)
SOURCES = [_CSRC / f"{name}.cpp" for name in _NAMES]
HEADERS = [
    _CSRC / f"{name}.h"
    for name in (*_NAMES[1:], "tiles", "simd_exp", "simd_lanes", "attention_train_body")
]


# OpenMP: `at::parallel_for` in the kernels runs on PyTorch's own OpenMP threads (its
# libgomp, already loaded, is the one the module links to); without the flag it is serial.
CFLAGS = ("-O3", "-fopenmp")
LDFLAGS = ("-fopenmp",)

STALE_LOCK_SECONDS = 600


class CompileError(RuntimeError):
    """The step could not be built or loaded here; the message says why."""


@cache
def _module_name() -> str:
    """One name per source text, PyTorch version and source directory, so a changed
    source or a new PyTorch never loads a stale build, and two installations do not
    rebuild in turn (the builder's ninja file names the sources by their paths)."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(_CSRC.resolve()).encode())
    digest.update(" ".join(CFLAGS + LDFLAGS).encode())  # tuples: the builder extends lists
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    return f"nmt_decoder_step_{digest.hexdigest()[:16]}"


def build_directory() -> Path:
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if base:
        return Path(base) / _module_name()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "nmt" / "extensions" / _module_name()


def is_built() -> bool:
    """Whether loading will be quick (the library is already compiled for this source)."""
    return (build_directory() / f"{_module_name()}.so").is_file()


@cache
def load_kernel() -> ModuleType:
    """The compiled module, built on the first call of the process if need be (once per
    process: loading an extension is process-wide anyway)."""
    check_tools()
    from torch.utils.cpp_extension import load

    try:
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(directory / "lock")
        return load(
            name=_module_name(),
            sources=[str(path) for path in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as exc:  # unwritable cache, a compiler error, a missing file, a bad .so
        first = str(exc).strip().splitlines()
        raise CompileError(first[0] if first else type(exc).__name__) from exc


def _clear_stale_lock(lock: Path) -> None:
    """PyTorch's builder holds `lock` while it compiles and others wait for it to go;
    a build killed outright (not interrupted: that releases it) leaves it behind, and
    every later run would wait forever. A build takes well under a minute."""
    with contextlib.suppress(FileNotFoundError):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink()


def check_tools() -> None:
    """Raise CompileError unless a build can start: a C++ compiler, and ninja.

    PyTorch's builder runs `ninja` from PATH. The ninja wheel (a dependency) installs it
    among this Python's scripts, which are not on PATH when `nmt` is run from a virtual
    environment that is not activated: that directory is added for the build."""
    if shutil.which("c++") is None:
        raise CompileError("no C++ compiler (c++) on PATH")
    if shutil.which("ninja") is not None:
        return
    scripts = sysconfig.get_path("scripts")
    if not (Path(scripts) / "ninja").is_file():
        raise CompileError("ninja is not installed (pip install ninja)")
    os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def prepare_kernel(on_compile: Callable[[], None] = lambda: None) -> ModuleType:
    """The compiled module; `on_compile` is called first when it has to be built (tens of
    seconds). Raises CompileError where it cannot be built or loaded here, a missing
    source file included."""
    try:
        built = is_built()
    except OSError as exc:  # a source file is missing or unreadable
        raise CompileError(f"cannot read the module's sources: {exc}") from exc
    if not built:
        check_tools()
        on_compile()
    return load_kernel()
