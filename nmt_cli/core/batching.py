"""Batches like the paper's: sentence pairs grouped by length into max-token batches.

Section 5.1: "Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source
tokens and 25000 target tokens." Here a batch holds as many pairs of similar length as fit
in `max_tokens` *padded* tokens on each side (sentences x longest sentence), so padding
stays small and the memory a batch needs is bounded.

One epoch's plan is a pure function of (lengths, max_tokens, seed, epoch): every rank of
a distributed run computes the same plan without talking to the others, takes its own
slots of each update, and knows the target-token count of the whole update (needed to
normalise the loss as one large batch would) without a collective. Resuming needs only
(epoch, update index).

Conventions (see `nmt_cli.core.vocab`): source = ids + [EOS]; target input = [BOS] + ids;
target output = ids + [EOS]; padding id 0 on the right. Each side is therefore one token
longer than its stored sequence.

On GPUs both sides are padded to a multiple of 8 (`multiple`): shapes then repeat, so
kernels, their autotuning and compiled graphs are reused, and tensor-core products see
aligned sizes. The batch cut counts that rounding, so `max_tokens` stays a true bound
on the padded size; masking makes the extra padding change no result.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt_cli.core.data import TokenStore
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID


def round_up(width: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is at least `width`."""
    return -(-width // multiple) * multiple


def length_grouped_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    multiple: int = 1,
) -> list[np.ndarray]:
    """One epoch's batches: arrays of example indices, every example exactly once.

    Examples are sorted by (target, source) length with ties broken by a seeded random
    permutation, cut greedily so that sentences x longest side <= max_tokens, and the
    batch order is shuffled. A pair longer than `max_tokens` on its own gets a batch of
    its own rather than being dropped silently (prepare filters overlong pairs).
    With `shuffle=False` the order is deterministic and independent of seed and epoch
    (for validation). With `multiple` > 1 the widths are counted rounded up to it, as
    `collate` pads them.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if multiple < 1:
        raise ValueError(f"the padding multiple must be positive, got {multiple}")
    src_len = np.asarray(src_lengths, dtype=np.int64) + 1  # + EOS
    tgt_len = np.asarray(tgt_lengths, dtype=np.int64) + 1  # + BOS / EOS
    n = len(src_len)
    if len(tgt_len) != n:
        raise ValueError(f"{n} source but {len(tgt_len)} target lengths")
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(n) if shuffle else np.arange(n)
    order = perm[np.lexsort((src_len[perm], tgt_len[perm]))]  # stable: ties keep perm order
    longest = np.maximum(src_len, tgt_len)[order]
    if multiple > 1:
        longest = -(-longest // multiple) * multiple
    # Sorted by target length, so a batch's longest side is (nearly) its last element;
    # the running maximum handles the source side exactly.
    bounds: list[int] = [0]
    width = 0
    start = 0
    for i, size in enumerate(longest.tolist()):
        width = max(width, size)
        if (i - start + 1) * width > max_tokens and i > start:
            bounds.append(i)
            start = i
            width = size
    bounds.append(n)
    batches = [order[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's batches grouped into optimizer updates of `world * accum` slots.

    Update u consists of batches [u * slots, (u + 1) * slots); rank r runs slots
    r * accum ... r * accum + accum - 1 of it. The last update may have empty slots: the
    rank runs a zero-weight batch there, so every rank makes the same number of forward
    and backward passes (DDP needs that) while each example still counts once.
    """

    batches: list[np.ndarray]
    tgt_tokens: np.ndarray  # (n_batches,) real target tokens per batch (with EOS)
    src_tokens: np.ndarray  # (n_batches,) real source tokens per batch (with EOS)
    world: int
    accum: int

    @property
    def slots(self) -> int:
        return self.world * self.accum

    @property
    def updates(self) -> int:
        return -(-len(self.batches) // self.slots)

    def rank_slots(self, update: int, rank: int) -> list[int | None]:
        """Batch indices this rank runs in `update`, None for an empty slot."""
        first = update * self.slots + rank * self.accum
        return [i if i < len(self.batches) else None for i in range(first, first + self.accum)]

    def update_tgt_tokens(self, update: int) -> int:
        """Target tokens of the whole update over all ranks: the loss normaliser."""
        lo = update * self.slots
        return int(self.tgt_tokens[lo : lo + self.slots].sum())

    def update_real_tokens(self, update: int) -> tuple[int, int]:
        """(source, target) real tokens of the whole update over all ranks."""
        lo = update * self.slots
        return int(self.src_tokens[lo : lo + self.slots].sum()), self.update_tgt_tokens(update)


def plan_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    world: int = 1,
    accum: int = 1,
    shuffle: bool = True,
    multiple: int = 1,
) -> EpochPlan:
    batches = length_grouped_batches(
        src_lengths, tgt_lengths, max_tokens, seed, epoch, shuffle, multiple
    )
    src_len = np.asarray(src_lengths, dtype=np.int64) + 1
    tgt_len = np.asarray(tgt_lengths, dtype=np.int64) + 1
    return EpochPlan(
        batches=batches,
        tgt_tokens=np.array([int(tgt_len[b].sum()) for b in batches], dtype=np.int64),
        src_tokens=np.array([int(src_len[b].sum()) for b in batches], dtype=np.int64),
        world=world,
        accum=accum,
    )


def real_token_fraction(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    multiple: int = 1,
) -> float:
    """Real tokens of the larger side per padded token of `max_tokens` batches.

    The padded budget (sentences x longest side) is what bounds memory, but the paper
    counts real tokens ("approximately 25000 source tokens and 25000 target tokens",
    section 5.1): padding and the shorter side of each pair make the two differ by about
    20% on WMT-like lengths. Measured on the whole corpus, not a sample: how densely a
    length-sorted batch is filled depends on how many pairs share each length.
    """
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if len(src) == 0:
        return 1.0
    padded = real_src = real_tgt = 0
    batches = length_grouped_batches(
        src, tgt, max_tokens, seed=0, epoch=0, shuffle=False, multiple=multiple
    )
    for b in batches:
        padded += len(b) * round_up(int(max(src[b].max(), tgt[b].max()) + 1), multiple)
        real_src += int(src[b].sum()) + len(b)
        real_tgt += int(tgt[b].sum()) + len(b)
    return max(real_src, real_tgt) / padded


@dataclass(frozen=True)
class Batch:
    """Padded id tensors of one batch, with the counts the trainer needs."""

    src: Tensor  # (B, S) ids + EOS
    tgt_in: Tensor  # (B, T) BOS + ids
    tgt_out: Tensor  # (B, T) ids + EOS
    src_tokens: int  # real tokens, padding excluded
    tgt_tokens: int

    @property
    def sentences(self) -> int:
        return int(self.src.size(0))

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`. To a GPU the copies go through page-locked memory: a
        copy from ordinary memory may wait for the GPU's queue to drain (a hidden host
        sync), one from page-locked memory overlaps with the work already queued."""
        pinned = torch.device(device).type == "cuda"
        return Batch(
            _copy(self.src, device, pinned),
            _copy(self.tgt_in, device, pinned),
            _copy(self.tgt_out, device, pinned),
            self.src_tokens,
            self.tgt_tokens,
        )


def _copy(t: Tensor, device: torch.device | str, pinned: bool) -> Tensor:
    if pinned and t.device.type == "cpu":
        t = t.pin_memory()  # CUDA only: page-locked memory needs the CUDA runtime
    return t.to(device, non_blocking=pinned)


Rows = Sequence[Sequence[int] | np.ndarray]


@dataclass(frozen=True)
class Flat:
    """A side's rows as one flat id tensor, each row's start in it and its length.

    `tokens` is in a dtype that PyTorch fully supports: a uint16 store is viewed as int16
    (the same bytes, no copy) and `modulus` (2**16) maps the gathered ids back, because
    PyTorch documents only limited eager support for uint16/32/64 (torch 2.11's CPU
    `torch.where` has no uint16 kernel at all). uint8, int32 and int64 are used as stored.
    """

    tokens: Tensor
    starts: Tensor
    lengths: Tensor
    modulus: int = 0  # 2**bits when `tokens` holds unsigned ids reinterpreted as signed

    def gather(self, positions: Tensor) -> Tensor:
        """The ids at `positions` (any shape), as int64."""
        ids = self.tokens[positions].long()
        return ids & (self.modulus - 1) if self.modulus else ids


# Unsigned store dtypes beyond uint8 -> the signed type of the same width PyTorch reads.
_SIGNED_VIEW: dict[np.dtype, np.dtype] = {
    np.dtype(np.uint16): np.dtype(np.int16),
    np.dtype(np.uint32): np.dtype(np.int32),
}


def torch_ids(tokens: np.ndarray) -> tuple[Tensor, int]:
    """`tokens` as a tensor of a fully supported dtype sharing their memory, and the
    modulus that maps its values back to the ids (0: none needed; see `Flat`)."""
    array = np.asarray(tokens)
    signed = _SIGNED_VIEW.get(array.dtype)
    if signed is None:
        return torch.from_numpy(array), 0
    return torch.from_numpy(array.view(signed)), 1 << (8 * array.dtype.itemsize)


def pad_sources(rows: Rows, multiple: int = 1) -> Tensor:
    """(B, S) source tensor: every row + EOS, right-padded with PAD to the longest row
    (rounded up to a multiple of `multiple`, so that decoding sees few distinct shapes).
    Written row by row in numpy: a batch to translate is in memory and small, and its few
    writes cost less than `_padded`'s dozen tensor operations, each of which runs from
    cold caches between two sentences' decoding (BENCHMARKS.md)."""
    lengths = [len(row) for row in rows]
    out = np.full((len(rows), round_up(max(lengths, default=0) + 1, multiple)), PAD_ID)
    for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        out[i, :length] = row
        out[i, length] = EOS_ID
    return torch.from_numpy(out.astype(np.int64, copy=False))


def _flat(side: TokenStore | Rows, idx: Sequence[int] | np.ndarray) -> Flat:
    """A store's own memory map, or an in-memory list's rows joined."""
    if isinstance(side, TokenStore):
        tokens, modulus = torch_ids(side.tokens)
        starts, lengths = side.offsets[idx], side.lengths[idx]
    else:
        rows = [np.asarray(side[i], dtype=np.int64) for i in idx]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        tokens, modulus = torch.from_numpy(np.concatenate([np.zeros(0, np.int64), *rows])), 0
    starts_t = torch.from_numpy(np.asarray(starts, dtype=np.int64))
    return Flat(tokens, starts_t, torch.from_numpy(np.asarray(lengths, dtype=np.int64)), modulus)


def _padded(flat: Flat, multiple: int, bos: bool) -> Tensor:
    """(B, W) int64: BOS (with `bos`) + each row's ids + EOS (without), then PAD; one
    gather for the whole batch, in PyTorch's operations, which release the GIL: a thread
    collating the next update must not hold the GIL the training thread needs, as a
    row-by-row loop (milliseconds of Python) or numpy's gather would (BENCHMARKS.md, "The
    training loop around the update"). Every operation after the gather sees int64 ids
    (`Flat.gather`), whatever the store's dtype."""
    starts, lengths = flat.starts, flat.lengths
    width = round_up(int(lengths.max()) + 1 if len(lengths) else 1, multiple)
    col = torch.arange(width) - int(bos)
    inside = (col >= 0) & (col < lengths[:, None])
    picked = torch.where(inside, starts[:, None] + col, 0)
    ids = flat.gather(picked) if len(flat.tokens) else torch.zeros_like(picked)
    out = torch.where(inside, ids, PAD_ID)
    out[torch.arange(len(lengths)), 0 if bos else lengths] = BOS_ID if bos else EOS_ID
    return out


def collate(
    src: TokenStore | Rows, tgt: TokenStore | Rows, indices: np.ndarray, multiple: int = 1
) -> Batch:
    """The padded tensors of the examples `indices` (the module's conventions), widths
    rounded up to a multiple of `multiple`; sides are token stores or lists of id arrays."""
    idx = np.asarray(indices, dtype=np.int64)
    src_flat, tgt_flat = _flat(src, idx), _flat(tgt, idx)
    return Batch(
        _padded(src_flat, multiple, bos=False),
        _padded(tgt_flat, multiple, bos=True),
        _padded(tgt_flat, multiple, bos=False),
        int(src_flat.lengths.sum()) + len(idx),
        int(tgt_flat.lengths.sum()) + len(idx),
    )
