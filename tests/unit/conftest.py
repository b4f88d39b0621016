"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch
from reverser import train_reverser

from nmt_cli.backends.cpu.build import CompileError, load_kernel
from nmt_cli.core.transformer import Transformer
from nmt_cli.cpu_level import LEVELS, cpu_level


@pytest.fixture(scope="session")
def reverser() -> Iterator[Transformer]:
    """Trained once for every test that decodes it. Tests leave it as they found it, in
    eval mode with its weights unchanged, which the session's end checks."""
    model = train_reverser()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    yield model
    assert not model.training, "a test left the shared reverser in training mode"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, weights[k])]
    assert not changed, f"a test changed the shared reverser's {changed}"


@pytest.fixture
def kernel() -> ModuleType:
    """The compiled module (backends/cpu/build.py), built once per PyTorch version and
    source (tens of seconds the first time); its tests skip where it cannot be built
    (no C++ compiler), as decoding then falls back to the Python step. Asked for again
    by each test: loading sets its kernels' level from NMT_CPU_LEVEL as it is now, so a
    test that ran with another level (a training under a monkeypatched NMT_CPU_LEVEL)
    leaves no cap behind for the tests after it, whatever their order."""
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
