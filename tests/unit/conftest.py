"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
from reverser import train_reverser

from nmt_cli.core.transformer import Transformer


@pytest.fixture(scope="session")
def reverser() -> Transformer:
    """Trained once for every test that decodes it."""
    return train_reverser()
