"""The part of `nmt translate --ray` that runs on each node, without Ray: a block of lines
translated by an actor's `BlockTranslator` is the bytes `nmt translate` writes for those
lines, numbered from the block's first line. And the options of --ray are refused
without it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from unix_helpers import nmt, one_error

from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import CheckpointError
from nmt_cli.engines.translate.block_worker import BlockTranslator, WorkerSpec
from nmt_cli.engines.translate.stream import translate_file
from tests.fixtures.translation_ckpt import COPY_POOL

LINES = [COPY_POOL[(3 * i) % len(COPY_POOL)] if i % 7 else "" for i in range(20)]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("nbest", "as_json"), [(2, False), (1, True)])
def test_a_block_is_what_translate_writes_for_its_lines(
    copy_model: Path, tmp_path: Path, nbest: int, as_json: bool
) -> None:
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    cfg = DecodeConfig(nbest=nbest, buffer_lines=10, threads=1, workers=1)
    translate_file([copy_model], cfg, source, out, as_json=as_json, alignment_layer=0)
    expected = out.read_bytes().splitlines(keepends=True)

    worker = BlockTranslator(WorkerSpec((str(copy_model),), cfg, as_json, alignment_layer=0))
    record, data = worker.translate_block(1, 11, LINES[10:])
    # The second chunk's lines, numbered as in the whole file (n-best's 0-based index,
    # JSON's "line"); JSON's chunk timing is the one thing that differs between runs.
    half = expected[len(expected) // 2 :]
    if as_json:
        assert [_untimed(x) for x in data.splitlines()] == [_untimed(x) for x in half]
    else:
        assert data == b"".join(half) and data.startswith(b"10 ||| ")
    assert (record.block, record.first_line, record.lines) == (1, 11, 10)
    assert record.sentences == sum(1 for line in LINES[10:] if line)
    assert record.size == len(data) and record.sha256 == hashlib.sha256(data).hexdigest()
    assert record.threads == 1 and record.precision in ("bf16", "fp32")
    assert record.target_tokens > 0 and record.truncated == 0


def _untimed(line: bytes) -> dict[str, object]:
    record = json.loads(line)
    record.pop("timing")
    return dict(record)


def test_a_checkpoint_a_node_cannot_load_fails_its_first_block(tmp_path: Path) -> None:
    """Raised by the block, not the constructor: Ray reports a constructor's error as the
    actor's death, in the text of a remote traceback."""
    bad = tmp_path / "model.pt"
    bad.write_text("not a checkpoint\n")
    worker = BlockTranslator(WorkerSpec((str(bad),), DecodeConfig(threads=1)))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        worker(None)


@pytest.mark.parametrize(
    ("extra", "flag"), [(["--parts"], "--parts"), (["--resume"], "--resume"), (["-i", "-"], "-i")]
)
def test_the_options_of_ray_are_refused_without_it(
    copy_model: Path, tmp_path: Path, extra: list[str], flag: str
) -> None:
    out = tmp_path / "out"
    args = ["translate", "-m", str(copy_model), "-i", "-", "-o", str(out), *extra]
    one_error(nmt(*args, stdin="the cat\n"), 2, flag, "--ray only")
    assert not out.exists()
