"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from reverser import train_reverser

from nmt_cli.backends.cpu.build import CompileError, load_kernel
from nmt_cli.core.transformer import Transformer
from nmt_cli.cpu_level import LEVELS, cpu_level


@pytest.fixture(scope="session")
def reverser() -> Transformer:
    """Trained once for every test that decodes it."""
    return train_reverser()


@pytest.fixture(scope="session")
def kernel() -> ModuleType:
    """The compiled module (backends/cpu/build.py), built once per PyTorch version and
    source (tens of seconds the first time); its tests skip where it cannot be built
    (no C++ compiler), as decoding then falls back to the Python step."""
    try:
        return load_kernel()
    except CompileError as exc:
        pytest.skip(f"the compiled module cannot be built here: {exc}")


@pytest.fixture
def kernel_at(kernel: ModuleType) -> Iterator[Callable[[str], ModuleType]]:
    """`kernel_at(level)`: the compiled module with its kernels capped at `level` for this
    test ("native": this CPU's own), as on a machine without the instructions above it;
    the cap is put back after the test."""

    def capped(level: str) -> ModuleType:
        kernel.set_cpu_level_cap(LEVELS.index(cpu_level() if level == "native" else level))
        return kernel

    yield capped
    kernel.set_cpu_level_cap(LEVELS.index(cpu_level()))
