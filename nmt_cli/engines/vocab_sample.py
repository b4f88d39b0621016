"""The vocabulary stage's pieces: a bounded, seeded sample of lines, and SentencePiece.

SentencePiece keeps every sentence it is given in memory, so a 36M-pair corpus must not
reach it whole: a seeded sample of line numbers (drawn once, sorted) is read back from the
cleaned text in one streaming pass. SentencePiece is told not to sample again, so the
same sample gives the same model bytes on every run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt_cli.core.vocab import train_sentencepiece
from nmt_cli.errors import NmtError


def sample_indices(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted line numbers of a seeded sample of k out of n (all of them if k >= n)."""
    if k >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=k, replace=False))


def sampled_lines(work: Path, sides: tuple[str, ...], chosen: np.ndarray) -> Iterator[str]:
    """The chosen lines of the cleaned training text, read in one streaming pass."""
    handles = [
        open(work / f"train.{side}", encoding="utf-8", newline="\n")  # noqa: SIM115
        for side in sides
    ]
    try:
        wanted = iter(chosen.tolist())
        target = next(wanted, None)
        for position, lines in enumerate(zip(*handles, strict=True)):
            if target is None:
                return
            if position == target:
                for line in lines:
                    yield line.rstrip("\n")
                target = next(wanted, None)
    finally:
        for fh in handles:
            fh.close()


def train_vocab(lines: Iterator[str], size: int, coverage: float, seed: int) -> bytes:
    """SentencePiece BPE; its limits become errors that say which setting to change."""
    spm.set_random_generator_seed(seed)
    try:
        return train_sentencepiece(lines, size, character_coverage=coverage, max_sentences=0)
    except RuntimeError as exc:
        message = str(exc)
        limit = re.search(r"value <= (\d+)", message)
        if limit:
            raise NmtError(
                f"--vocab-size {size:,} is larger than the training data supports "
                f"(at most {int(limit.group(1)):,} here); "
                f"pass --vocab-size {limit.group(1)} or less"
            ) from None
        small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
        if small:
            raise NmtError(
                f"--vocab-size {size:,} is smaller than the {small.group(2)} distinct characters "
                "of the data; raise --vocab-size"
            ) from None
        raise NmtError(f"SentencePiece could not train the vocabulary: {message.strip()}") from None
