"""The shared text reader: plain or gzipped files, checked line by line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from nmt_cli.errors import NmtError
from nmt_cli.text_io import LineDecoder, TextPairs


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_plain_and_gzipped_files_stream_stripped_pairs(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en.gz", "\ufeffHello world \nSecond\r\n".encode(), gz=True)
    tgt = write(tmp_path / "a.de", b"Hallo Welt\nZweite\n")
    assert list(TextPairs(src, tgt).pairs()) == [
        ("Hello world", "Hallo Welt"),
        ("Second", "Zweite"),
    ]


def test_line_breaks_inside_a_sentence_become_spaces(tmp_path: Path) -> None:
    """A lone CR or U+2028 would split the sentence in any line-based reader downstream."""
    src = write(tmp_path / "a.en", "one\rtwo\u2028three\nfour\n".encode())
    tgt = write(tmp_path / "a.de", "eins\x85zwei\nvier\n".encode())
    assert list(TextPairs(src, tgt).pairs()) == [("one two three", "eins zwei"), ("four", "vier")]


def test_different_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    src = write(tmp_path / "train.en", b"a\nb\nc\n")
    tgt = write(tmp_path / "train.de", b"x\ny\n")
    with pytest.raises(NmtError) as err:
        list(TextPairs(src, tgt).pairs())
    message = str(err.value)
    assert f"{src} has 3 lines but {tgt} has 2" in message
    with pytest.raises(NmtError, match="has 2 lines but .* has 3"):
        list(TextPairs(tgt, src).pairs())


def test_bad_utf8_names_file_and_line_or_is_replaced_and_counted(tmp_path: Path) -> None:
    src = write(tmp_path / "train.en", b"fine\nbad \xff byte\nfine\n")
    tgt = write(tmp_path / "train.de", b"gut\ngut\ngut\n")
    with pytest.raises(NmtError, match=r"train\.en:2: not valid UTF-8 \(byte 0xff at column 5\)"):
        list(TextPairs(src, tgt).pairs())
    decoder = LineDecoder("replace")
    pairs = list(TextPairs(src, tgt, decoder).pairs())
    assert pairs[1] == ("bad \ufffd byte", "gut")
    assert decoder.replaced == 1


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    tgt = write(tmp_path / "t.de", b"x\n")
    with pytest.raises(NmtError, match="no such file"):
        list(TextPairs(tmp_path / "nope.en", tgt).pairs())
    broken = write(tmp_path / "b.en.gz", gzip.compress(b"a\n" * 1000)[:30])
    with pytest.raises(NmtError, match="unreadable"):
        list(TextPairs(broken, tgt).pairs())
