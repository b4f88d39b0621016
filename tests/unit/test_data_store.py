"""The .bin/.idx token store: round trips, dtype choice, atomicity, and parallel encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nmt_cli.core.data import TokenStore, TokenStoreWriter, smallest_dtype
from nmt_cli.core.vocab import Vocab, train_sentencepiece
from nmt_cli.engines.prepare.binarize import encode_to_stores


@pytest.mark.parametrize(
    ("vocab_size", "dtype"),
    [(8, np.uint8), (256, np.uint8), (257, np.uint16), (65_536, np.uint16), (65_537, np.int32)],
)
def test_smallest_dtype_fits_every_id(vocab_size: int, dtype: type) -> None:
    assert smallest_dtype(vocab_size) == dtype
    assert vocab_size - 1 <= np.iinfo(dtype).max


@pytest.mark.parametrize("vocab_size", [200, 40_000, 100_000])
def test_round_trip_with_add_and_add_flat(tmp_path: Path, vocab_size: int) -> None:
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, vocab_size, size=n).tolist() for n in (5, 0, 1, 17, 3)]
    writer = TokenStoreWriter(tmp_path / "train.src", vocab_size)
    writer.add(seqs[0])
    writer.add(seqs[1])
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs[2:]])
    writer.add_flat(flat, np.array([len(s) for s in seqs[2:]]))
    assert len(writer) == len(seqs)
    writer.close()

    store = TokenStore(tmp_path / "train.src")
    assert store.dtype == smallest_dtype(vocab_size)
    assert len(store) == len(seqs)
    assert [store[i].tolist() for i in range(len(store))] == seqs
    assert store.lengths.tolist() == [len(s) for s in seqs]
    assert (tmp_path / "train.src.bin").stat().st_size == sum(map(len, seqs)) * np.dtype(
        store.dtype
    ).itemsize


def test_source_and_target_of_a_split_do_not_share_files(tmp_path: Path) -> None:
    for side, ids in (("src", [4, 5]), ("tgt", [6, 7, 8])):
        writer = TokenStoreWriter(tmp_path / f"valid.{side}", 100)
        writer.add(ids)
        writer.close()
    assert TokenStore(tmp_path / "valid.src")[0].tolist() == [4, 5]
    assert TokenStore(tmp_path / "valid.tgt")[0].tolist() == [6, 7, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "valid.src.bin",
        "valid.src.idx",
        "valid.tgt.bin",
        "valid.tgt.idx",
    ]


def test_nothing_looks_complete_before_close_and_abort_leaves_nothing(tmp_path: Path) -> None:
    writer = TokenStoreWriter(tmp_path / "train.src", 100)
    writer.add([1, 2, 3])
    assert not (tmp_path / "train.src.bin").exists()
    assert not (tmp_path / "train.src.idx").exists()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_add_flat_refuses_lengths_that_do_not_add_up(tmp_path: Path) -> None:
    writer = TokenStoreWriter(tmp_path / "x", 100)
    with pytest.raises(ValueError, match="lengths sum to 3"):
        writer.add_flat(np.array([1, 2]), np.array([1, 2]))
    writer.abort()


def test_truncated_index_is_refused(tmp_path: Path) -> None:
    writer = TokenStoreWriter(tmp_path / "x", 100)
    writer.add_flat(np.array([1, 2, 3]), np.array([2, 1]))
    writer.close()
    idx = tmp_path / "x.idx"
    idx.write_bytes(idx.read_bytes()[:-8])
    with pytest.raises(ValueError, match="index holds"):
        TokenStore(tmp_path / "x")


def test_parallel_encoding_matches_one_process(tmp_path: Path) -> None:
    """Two worker processes, many small chunks: same stores as encoding in-process."""
    words = ["the", "a", "dog", "cat", "sees", "finds", "big", "small", "house", "tree", "runs"]
    rng = np.random.default_rng(1)
    pairs = [(" ".join(rng.choice(words, 6)), " ".join(rng.choice(words, 7))) for _ in range(600)]
    proto = train_sentencepiece([p for pair in pairs for p in pair], vocab_size=60)
    results = {}
    for workers in (1, 2):
        out = tmp_path / str(workers)
        src_w = TokenStoreWriter(out / "train.src", 60)
        tgt_w = TokenStoreWriter(out / "train.tgt", 60)
        counts = encode_to_stores(pairs, src_w, tgt_w, proto, proto, 60, workers, chunk_pairs=50)
        src_w.close()
        tgt_w.close()
        results[workers] = (
            counts,
            (out / "train.src.bin").read_bytes(),
            (out / "train.tgt.idx").read_bytes(),
        )
    assert results[1] == results[2]
    assert results[1][0].pairs == 600
    vocab = Vocab.from_proto(proto)
    store = TokenStore(tmp_path / "2" / "train.src")
    assert [vocab.decode(store[i].tolist()) for i in (0, 599)] == [pairs[0][0], pairs[599][0]]
