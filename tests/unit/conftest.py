"""Fixtures shared by the unit tests."""

from __future__ import annotations

from types import ModuleType

import pytest
from reverser import train_reverser

from nmt_cli.core.compiled_step import load_kernel
from nmt_cli.core.transformer import Transformer


@pytest.fixture(scope="session")
def reverser() -> Transformer:
    """Trained once for every test that decodes it."""
    return train_reverser()


@pytest.fixture(scope="session")
def kernel() -> ModuleType:
    """The compiled module (core/compiled_step.py), built once per PyTorch version and
    source (tens of seconds the first time)."""
    return load_kernel()
