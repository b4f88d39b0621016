"""Models shared by several test files, trained once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from translation_ckpt import ALIGN_POOL, copy_checkpoint, tiny_vocab


@pytest.fixture(scope="session")
def reverser_unseen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reverses the words of sentences it has never seen: its cross-attention follows the
    words it writes, so alignments and pictures have a known truth (the anti-diagonal)."""
    path = tmp_path_factory.mktemp("align") / "reverse.pt"
    return copy_checkpoint(path, tiny_vocab(), steps=900, reverse=True, pool=ALIGN_POOL)
