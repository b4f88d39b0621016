"""The vocab stage: byte-pair encoding learned by SentencePiece on a sample of the text.

The paper encodes sentences "using byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens" (section 5.1): one model learned on both sides, which is
the default here (`joint`); `--separate-vocab` learns one model per language instead.

With `--vocab-from CHECKPOINT` nothing is learned: the model's own SentencePiece models
are written instead, so that a corpus for fine-tuning is cut into the pieces, and numbered
with the ids, that the model was trained (or imported) with.

SentencePiece keeps every sentence it is given in memory, so a 36M-pair corpus must not
reach it whole: a seeded sample of line numbers (drawn once, sorted) is read back from the
cleaned text in one streaming pass. SentencePiece is told not to sample again, so the
same sample gives the same model bytes on every run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sentencepiece as spm

from nmt_cli.core.files import atomic_write_bytes
from nmt_cli.core.vocab import train_sentencepiece
from nmt_cli.engines.prepare.layout import SIDES, Layout
from nmt_cli.engines.prepare.progress import Progress, step
from nmt_cli.errors import NmtError

if TYPE_CHECKING:  # reading a checkpoint imports torch: only with --vocab-from
    from nmt_cli.core.vocab import VocabPair


@dataclass(frozen=True)
class VocabInputs:
    """What the vocab stage needs to know about the cleaned training text and the user."""

    train_pairs: int  # cleaned training pairs in the work folder
    size: int
    character_coverage: float
    joint: bool  # the paper's shared source-target vocabulary (section 5.1)
    sample_lines: int  # lines SentencePiece sees, at most (both sides together when joint)
    seed: int
    whole_words: tuple[str, ...] = ()  # words kept as one piece each (a treebank's brackets)


@dataclass(frozen=True)
class Vocabulary:
    """The SentencePiece model files the vocab stage wrote: one when joint, else src, tgt."""

    files: tuple[str, ...]
    sample_pairs: int  # training pairs the models were learned from

    @property
    def src_model(self) -> str:
        return self.files[0]

    @property
    def tgt_model(self) -> str:
        return self.files[-1]

    @property
    def pairs(self) -> int:
        """The stage's count in `nmt prepare`'s summary: the pairs it sampled."""
        return self.sample_pairs

    @property
    def joint(self) -> bool:
        return len(self.files) == 1

    def to_json(self) -> dict[str, Any]:
        return {"files": list(self.files), "sample_pairs": self.sample_pairs}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Vocabulary:
        return cls(tuple(raw["files"]), int(raw["sample_pairs"]))


def build_vocabulary(inputs: VocabInputs, layout: Layout, progress: Progress) -> Vocabulary:
    """Learn the BPE model(s) on one seeded sample of training pairs; write them to `out`."""
    groups = [SIDES] if inputs.joint else [(side,) for side in SIDES]
    per_model_pairs = inputs.sample_lines // len(groups[0])
    chosen = sample_indices(inputs.train_pairs, per_model_pairs, inputs.seed)
    files: list[str] = []
    for group in groups:
        name = "spm.model" if inputs.joint else f"spm.{group[0]}.model"
        with step(progress, "vocab", f"vocabulary {name}", len(chosen)) as work:
            lines = sampled_lines([layout.cleaned("train", side) for side in group], chosen)
            proto = train_vocab(
                lines, inputs.size, inputs.character_coverage, inputs.seed, inputs.whole_words
            )
            atomic_write_bytes(layout.out / name, proto)
            files.append(name)
            work.advance(len(chosen))
    return Vocabulary(tuple(files), len(chosen))


def model_vocabulary(path: str) -> VocabPair:
    """The vocabulary inside a checkpoint (any kind nmt writes or imports)."""
    from nmt_cli.core.checkpoint import load_checkpoint

    return load_checkpoint(path).vocab


def write_vocabulary(vocab: VocabPair, layout: Layout) -> Vocabulary:
    """The vocab stage of `--vocab-from`: the model's SentencePiece models, as they are."""
    if vocab.joint:
        atomic_write_bytes(layout.out / "spm.model", vocab.src.model_proto)
        return Vocabulary(("spm.model",), 0)
    for side, proto in zip(SIDES, (vocab.src.model_proto, vocab.tgt.model_proto), strict=True):
        atomic_write_bytes(layout.out / f"spm.{side}.model", proto)
    return Vocabulary(tuple(f"spm.{side}.model" for side in SIDES), 0)


def sample_indices(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted line numbers of a seeded sample of k out of n (all of them if k >= n)."""
    if k >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=k, replace=False))


def sampled_lines(paths: list[Path], chosen: np.ndarray) -> Iterator[str]:
    """The chosen lines of parallel files (each file's in turn), read in one streaming pass."""
    handles = [
        open(path, encoding="utf-8", newline="\n")  # noqa: SIM115
        for path in paths
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


def train_vocab(
    lines: Iterator[str], size: int, coverage: float, seed: int, whole_words: tuple[str, ...] = ()
) -> bytes:
    """SentencePiece BPE; its limits become errors that say which setting to change."""
    spm.set_random_generator_seed(seed)
    try:
        return train_sentencepiece(
            lines, size, character_coverage=coverage, max_sentences=0, whole_words=whole_words
        )
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
