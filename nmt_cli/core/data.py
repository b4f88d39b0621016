"""Memory-mapped token store: a flat `.bin` array of token ids plus an `.idx` of offsets.

The layout follows fairseq's MMapIndexedDataset in spirit: any sentence is read in O(1)
without loading the corpus, and ids use the smallest integer type that fits the
vocabulary. The `.idx` file is a small header, then (n + 1) int64 offsets into `.bin`.

    header: magic b"NMTIDX\\x00\\x01", dtype code (uint8), n (int64)

Stored sequences hold subword ids only; the batcher adds BOS/EOS where each side needs it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from nmt_cli.core.files import atomic_path

MAGIC = b"NMTIDX\x00\x01"
_DTYPES: dict[int, type[np.integer]] = {1: np.uint8, 2: np.uint16, 3: np.int32, 4: np.int64}
_HEADER = struct.Struct("<8sBq")


def smallest_dtype(vocab_size: int) -> type[np.integer]:
    """The narrowest integer type that holds every id below `vocab_size`."""
    for dtype in (np.uint8, np.uint16, np.int32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def _with_ext(prefix: Path, ext: str) -> Path:
    """`train.src` -> `train.src.bin`: appended, not `with_suffix`, which would drop `.src`."""
    return prefix.with_name(prefix.name + ext)


def _code(dtype: type[np.integer]) -> int:
    return next(code for code, d in _DTYPES.items() if d == dtype)


class TokenStoreWriter:
    """Append sequences, then `close()` renames both files into place atomically.

    Until `close()` only temporary files exist, so an interrupted write never leaves a
    store that looks complete.
    """

    def __init__(self, prefix: str | Path, vocab_size: int) -> None:
        self.prefix = Path(prefix)
        self.dtype = smallest_dtype(vocab_size)
        self._bin_ctx = atomic_path(_with_ext(self.prefix, ".bin"))
        self._bin_tmp = self._bin_ctx.__enter__()
        self._bin = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in close()
        # Offsets stream to the temporary index as they come, so memory does not grow with
        # the corpus; the header's count is filled in by close().
        self._idx_ctx = atomic_path(_with_ext(self.prefix, ".idx"))
        self._idx_tmp = self._idx_ctx.__enter__()
        self._idx = open(self._idx_tmp, "wb")  # noqa: SIM115 - closed in close()
        self._idx.write(_HEADER.pack(MAGIC, _code(self.dtype), 0))
        self._idx.write(np.zeros(1, dtype=np.int64).tobytes())
        self._n = 0
        self.tokens = 0

    def add(self, ids: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        self._bin.write(arr.tobytes())
        self.tokens += int(arr.size)
        self._idx.write(np.int64(self.tokens).tobytes())
        self._n += 1

    def add_flat(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append many sequences at once: their ids concatenated, and each one's length."""
        flat = np.asarray(ids, dtype=self.dtype)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != flat.size:
            raise ValueError(f"lengths sum to {int(lengths.sum())} but {flat.size} ids were given")
        self._bin.write(flat.tobytes())
        self._idx.write((self.tokens + np.cumsum(lengths)).astype(np.int64).tobytes())
        self.tokens += int(flat.size)
        self._n += len(lengths)

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        self._bin.close()
        self._idx.seek(0)
        self._idx.write(_HEADER.pack(MAGIC, _code(self.dtype), self._n))
        self._idx.close()
        self._idx_ctx.__exit__(None, None, None)
        self._bin_ctx.__exit__(None, None, None)

    def abort(self) -> None:
        self._bin.close()
        self._idx.close()
        self._idx_ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
        self._bin_ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)


class TokenStore:
    """A written store, mapped copy-on-write so that PyTorch can index it (never written)."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx_path, bin_path = _with_ext(self.prefix, ".idx"), _with_ext(self.prefix, ".bin")
        with open(idx_path, "rb") as fh:
            head = fh.read(_HEADER.size)
            if len(head) < _HEADER.size:
                raise ValueError(f"{idx_path}: truncated index")
            magic, code, n = _HEADER.unpack(head)
            if magic != MAGIC or code not in _DTYPES:
                raise ValueError(f"{idx_path}: not an nmt token index")
        self.offsets = np.memmap(idx_path, dtype=np.int64, mode="r", offset=_HEADER.size)
        if len(self.offsets) != n + 1:
            raise ValueError(f"{idx_path}: index holds {len(self.offsets) - 1} of {n} entries")
        self.dtype = _DTYPES[code]
        expected = int(self.offsets[-1]) * np.dtype(self.dtype).itemsize
        if os.path.getsize(bin_path) != expected:
            raise ValueError(f"{bin_path}: size does not match its index")
        self.tokens: np.ndarray = (
            np.memmap(bin_path, dtype=self.dtype, mode="c")
            if expected
            else np.zeros(0, dtype=self.dtype)
        )
        self.lengths: np.ndarray = np.diff(self.offsets).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]
