"""The binarize stage: each split's cleaned text encoded into memory-mapped token stores.

Chunks of pairs go to a process pool whose workers each load the SentencePiece models
once; results come back in submission order as flat id arrays plus lengths, and are
appended to the stores. At most `2 * workers` chunks are in flight, so memory stays flat
however large the corpus is (a plain `Pool.imap` would read the whole input ahead).
Each split is written atomically and recorded as soon as it is done, so a killed run
resumes with the next split.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt_cli.core.data import TokenStoreWriter, smallest_dtype
from nmt_cli.cpus import usable_cpus
from nmt_cli.engines.prepare.layout import Layout
from nmt_cli.engines.prepare.progress import Progress, step
from nmt_cli.engines.prepare.vocabulary import Vocabulary

CHUNK_PAIRS = 8192
# below this many pairs, starting worker processes costs more than it saves
POOL_MIN_PAIRS = 50_000

Encoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class EncodeCounts:
    pairs: int
    src_tokens: int
    tgt_tokens: int
    max_src_len: int
    max_tgt_len: int


@dataclass(frozen=True)
class BinarizeInputs:
    """The splits still to encode (name -> cleaned pairs, in order) and the vocabulary."""

    splits: dict[str, int]
    vocabulary: Vocabulary
    vocab_size: int
    workers: int = 0  # encoding processes, 0 = one per core; does not change the result


def binarize(
    inputs: BinarizeInputs,
    layout: Layout,
    progress: Progress,
    on_split: Callable[[str, EncodeCounts], None],
) -> int:
    """Encode each split into `out`, calling `on_split` as each one is complete; pairs done."""
    src_proto = (layout.out / inputs.vocabulary.src_model).read_bytes()
    tgt_proto = (layout.out / inputs.vocabulary.tgt_model).read_bytes()
    workers = inputs.workers or usable_cpus()
    total = 0
    for split, n in inputs.splits.items():
        with step(progress, "binarize", f"binarize {split}", n) as work:
            src_w = TokenStoreWriter(layout.store(split, "src"), inputs.vocab_size)
            tgt_w = TokenStoreWriter(layout.store(split, "tgt"), inputs.vocab_size)
            try:
                counts = encode_to_stores(
                    _read_pairs(layout.cleaned(split, "src"), layout.cleaned(split, "tgt")),
                    src_w,
                    tgt_w,
                    src_proto,
                    tgt_proto,
                    inputs.vocab_size,
                    workers if n > POOL_MIN_PAIRS else 1,
                    work.advance,
                )
            except BaseException:
                src_w.abort()
                tgt_w.abort()
                raise
            src_w.close()
            tgt_w.close()
        on_split(split, counts)
        total += n
    return total


def _read_pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    with (
        open(src, encoding="utf-8", newline="\n") as fs,
        open(tgt, encoding="utf-8", newline="\n") as ft,
    ):
        for a, b in zip(fs, ft, strict=True):
            yield a.rstrip("\n"), b.rstrip("\n")


class _Encoder:
    """Both SentencePiece processors, built once per process from the model bytes."""

    def __init__(self, src_proto: bytes, tgt_proto: bytes, vocab_size: int) -> None:
        self.src = spm.SentencePieceProcessor()
        self.src.LoadFromSerializedProto(src_proto)
        self.tgt = self.src
        if tgt_proto != src_proto:
            self.tgt = spm.SentencePieceProcessor()
            self.tgt.LoadFromSerializedProto(tgt_proto)
        self.dtype = smallest_dtype(vocab_size)

    def _side(self, proc: spm.SentencePieceProcessor, texts: list[str]) -> tuple[np.ndarray, ...]:
        ids = proc.Encode(texts, out_type=int)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=int(lengths.sum()))
        return flat, lengths

    def encode(self, chunk: list[tuple[str, str]]) -> Encoded:
        src_flat, src_len = self._side(self.src, [a for a, _ in chunk])
        tgt_flat, tgt_len = self._side(self.tgt, [b for _, b in chunk])
        return src_flat, src_len, tgt_flat, tgt_len


_WORKER: _Encoder | None = None


def _init_worker(src_proto: bytes, tgt_proto: bytes, vocab_size: int, parent: int) -> None:
    global _WORKER  # one encoder per worker process, built by the pool's initializer
    _WORKER = _Encoder(src_proto, tgt_proto, vocab_size)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A killed prepare (kill -9) must not leave its workers waiting on the queue forever."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _encode_in_worker(chunk: list[tuple[str, str]]) -> Encoded:
    assert _WORKER is not None
    return _WORKER.encode(chunk)


def _start_method() -> str:
    """fork where the platform has it: workers start at once and share the parent's imports.

    spawn would re-import the calling program (with torch, hundreds of MB and seconds per
    worker) and fails in scripts without a `__main__` guard. The workers only run
    SentencePiece and numpy, which hold no locks across the fork.
    """
    methods = multiprocessing.get_all_start_methods()
    return "fork" if "fork" in methods else "spawn"


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(islice(it, size)):
        yield chunk


def encode_to_stores(
    pairs: Iterable[tuple[str, str]],
    src_writer: TokenStoreWriter,
    tgt_writer: TokenStoreWriter,
    src_proto: bytes,
    tgt_proto: bytes,
    vocab_size: int,
    workers: int,
    advance: Callable[[int], None] = lambda n: None,
    chunk_pairs: int = CHUNK_PAIRS,
) -> EncodeCounts:
    """Encode `pairs` into the two writers (which the caller closes) and count tokens."""
    max_src = max_tgt = n = 0

    def write(result: Encoded) -> None:
        nonlocal max_src, max_tgt, n
        src_flat, src_len, tgt_flat, tgt_len = result
        src_writer.add_flat(src_flat, src_len)
        tgt_writer.add_flat(tgt_flat, tgt_len)
        if len(src_len):
            max_src = max(max_src, int(src_len.max()))
            max_tgt = max(max_tgt, int(tgt_len.max()))
        n += len(src_len)
        advance(len(src_len))

    chunks = _chunks(pairs, chunk_pairs)
    if workers <= 1:
        encoder = _Encoder(src_proto, tgt_proto, vocab_size)
        for chunk in chunks:
            write(encoder.encode(chunk))
    else:
        context = multiprocessing.get_context(_start_method())
        with ProcessPoolExecutor(
            workers,
            context,
            initializer=_init_worker,
            initargs=(src_proto, tgt_proto, vocab_size, os.getpid()),
        ) as pool:
            pending: deque[Future[Encoded]] = deque()
            for chunk in chunks:
                pending.append(pool.submit(_encode_in_worker, chunk))
                while len(pending) >= 2 * workers:
                    write(pending.popleft().result())
            while pending:
                write(pending.popleft().result())
    return EncodeCounts(n, src_writer.tokens, tgt_writer.tokens, max_src, max_tgt)
