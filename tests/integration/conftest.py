"""Models shared by several test files, trained once per session.

Tests only read them: one that changes a checkpoint copies it to its tmp_path first (the
session's end checks, tests/fixtures/files.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.files import built_once, shared_read_only
from tests.fixtures.translation_ckpt import ALIGN_POOL, ALIGN_UNSEEN, copy_checkpoint, tiny_vocab


@pytest.fixture(scope="session")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Copies COPY_POOL's sentences by heart (tiny_vocab, d_model 64): translate, export,
    ensemble, serve and fine-tuning tests decode it exactly. 150 steps leave every token
    of those sentences more than 5 nats above the next one, so bf16 and int8 arithmetic
    cannot flip a word."""
    root = built_once(
        tmp_path_factory,
        "copy",
        lambda root: copy_checkpoint(root / "copy.pt", tiny_vocab(), steps=150),
    )
    with shared_read_only(root):
        yield root / "copy.pt"


@pytest.fixture(scope="session")
def reverser_unseen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Reverses the words of sentences it has never seen: its cross-attention follows the
    words it writes, so alignments and pictures have a known truth (the anti-diagonal)."""

    def train(root: Path) -> None:
        # Batches of 64: with 32, about 1 unseen sentence in 100 (of 5 or 6 words) came
        # out wrong or with a neighbour's attention, depending on the CPU level's
        # summation order.
        copy_checkpoint(
            root / "reverse.pt",
            tiny_vocab(),
            steps=1200,
            reverse=True,
            pool=ALIGN_POOL,
            batch=64,
            until=ALIGN_UNSEEN,
        )

    root = built_once(tmp_path_factory, "align", train)
    with shared_read_only(root):
        yield root / "reverse.pt"
