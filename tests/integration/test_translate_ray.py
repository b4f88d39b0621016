"""`nmt translate --ray` on a two-node Ray cluster on this machine (Ray's own local cluster
utility: a head and a second node, one CPU each, so the two actors run on different
nodes): the output is the bytes `nmt translate` writes for the same input, an actor killed
mid-run is restarted and its blocks retried with every line written once, and a stopped
job resumes with only the blocks it had not written.

Skipped where ray (the `ray` extra) is not installed. Each test starts actors that load
torch and the model, so they are slow; the cluster is started once for them all.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from unix_helpers import nmt, no_escape, one_error

from tests.fixtures.translation_ckpt import COPY_POOL

pytest.importorskip("ray.data")
from ray.cluster_utils import Cluster

from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.corpus_parts import MANIFEST, BlockRecord
from nmt_cli.engines.translate.ray_corpus import RayJob, translate_on_ray
from nmt_cli.engines.translate.ray_reading import reader_threads
from nmt_cli.errors import Interrupted, NmtError

# Ray Data warns of its own deprecated settings when it copies its context.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BLOCK = 8  # --buffer-lines: 72 lines are 9 blocks
LINES = [COPY_POOL[(5 * i) % len(COPY_POOL)] if i % 10 else "" for i in range(9 * BLOCK)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head and a second node on this machine, one CPU each."""
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
        yield nodes
    finally:
        nodes.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ray") / "in.txt"
    path.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    return path


def single_machine(model: Path, corpus: Path, out: Path, *flags: str) -> bytes:
    """What `nmt translate` writes, two batches at once, in chunks of BLOCK lines."""
    args = ("-m", str(model), "-i", str(corpus), "-o", str(out), "--buffer-lines", str(BLOCK))
    result = nmt("translate", *args, "--workers", "2", *flags)
    no_escape(result)
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def untimed(data: bytes) -> list[dict[str, object]]:
    """JSON lines without their chunk's timing, the one field that differs run to run."""
    records = [json.loads(line) for line in data.splitlines()]
    for record in records:
        record.pop("timing")
    return records


def test_cli_on_two_nodes_writes_what_translate_writes(
    cluster: Cluster, copy_model: Path, corpus: Path, tmp_path: Path
) -> None:
    expected = single_machine(copy_model, corpus, tmp_path / "expected.txt")
    out = tmp_path / "out.txt"
    args = ("-m", str(copy_model), "-i", str(corpus), "-o", str(out), "--buffer-lines", "8")
    result = nmt("translate", *args, "--ray-address", cluster.address, "--workers", "2")
    no_escape(result)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == expected
    assert "translated 72 lines" in result.stderr and "2 actor(s) x 1 thread(s)" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expected.txt", "out.txt"]

    # n-best lists with alignments, as a directory of parts described by a manifest
    flags = ("--nbest", "2", "--alignment")
    expected = single_machine(copy_model, corpus, tmp_path / "nbest.txt", *flags)
    parts = tmp_path / "parts"
    args = ("-m", str(copy_model), "-i", str(corpus), "-o", str(parts), "--buffer-lines", "8")
    result = nmt("translate", *args, "--ray-address", cluster.address, *flags, "--parts")
    no_escape(result)
    assert result.exit_code == 0, result.output
    manifest = json.loads((parts / MANIFEST).read_text())
    assert manifest["lines"] == 72 and [p["first_line"] for p in manifest["parts"]] == list(
        range(1, 73, BLOCK)
    )
    assert b"".join((parts / p["file"]).read_bytes() for p in manifest["parts"]) == expected
    assert sorted(p.name for p in parts.iterdir()) == sorted(
        [MANIFEST, *(p["file"] for p in manifest["parts"])]
    )


def test_an_actor_killed_mid_run_is_retried_and_every_line_written_once(
    cluster: Cluster, copy_model: Path, corpus: Path, tmp_path: Path
) -> None:
    expected = single_machine(copy_model, corpus, tmp_path / "expected.txt")
    killed: list[int] = []

    def kill_the_first_actor(record: BlockRecord) -> None:
        if not killed:
            killed.append(record.pid)
            os.kill(record.pid, signal.SIGKILL)  # it has more blocks queued

    out = tmp_path / "out"
    job = RayJob(
        models=(copy_model,),
        cfg=DecodeConfig(buffer_lines=BLOCK, workers=2),
        inputs=(corpus,),
        output=out,
        parts=True,
        address=cluster.address,
    )
    report = translate_on_ray(job, on_block=kill_the_first_actor)
    manifest = json.loads((out / MANIFEST).read_text())
    assert b"".join((out / p["file"]).read_bytes() for p in manifest["parts"]) == expected
    assert [p["block"] for p in manifest["parts"]] == list(range(9))
    assert report.lines == 72 and report.translated == set(range(9))
    # Ray restarted the killed actor (a new process) and gave it its blocks again.
    pids = {p["pid"] for p in manifest["parts"]}
    assert killed[0] in pids and len(pids) >= 3, pids


def test_a_stopped_job_resumes_with_the_blocks_it_had_not_written(
    cluster: Cluster, copy_model: Path, corpus: Path, tmp_path: Path
) -> None:
    expected = single_machine(copy_model, corpus, tmp_path / "expected.jsonl", "--json")
    out = tmp_path / "out.jsonl"
    job = RayJob(
        models=(copy_model,),
        cfg=DecodeConfig(buffer_lines=BLOCK, workers=2),
        inputs=(corpus,),
        output=out,
        address=cluster.address,
        as_json=True,
    )
    first: list[int] = []

    def ctrl_c_after_three(record: BlockRecord) -> None:
        first.append(record.block)
        if len(first) == 3:
            raise KeyboardInterrupt  # as Ctrl-C does, in the driver, while Ray Data reads

    staging = tmp_path / "out.jsonl.parts"
    with pytest.raises(Interrupted) as stopped:
        translate_on_ray(job, on_block=ctrl_c_after_three)
    assert str(stopped.value) == (
        f"interrupted; the 3 block(s) written stay in {staging}: "
        "rerun with --resume to translate the rest"
    )
    assert stopped.value.exit_code == 130
    # Ray Data's reading ended before the driver disconnected: none of its threads is
    # left to call into Ray afterwards, which would end this process with exit status 1.
    assert reader_threads() == []
    assert not out.exists()
    assert len(list(staging.glob("part-*.jsonl"))) == 3

    with pytest.raises(NmtError, match=r"3 block\(s\) written\): pass --resume"):
        translate_on_ray(job)
    other = replace(job, cfg=replace(job.cfg, beam_size=2), resume=True)
    with pytest.raises(NmtError, match="other inputs, models or settings"):
        translate_on_ray(other)

    second: list[int] = []
    report = translate_on_ray(replace(job, resume=True), on_block=lambda r: second.append(r.block))
    assert sorted(first + second) == list(range(9)) and report.translated == set(second)
    assert "3 of 9 blocks were already written" in report.summary()
    assert untimed(out.read_bytes()) == untimed(expected)
    assert not staging.exists()


def test_a_bad_line_stops_with_its_file_and_line_before_any_translation(
    cluster: Cluster, copy_model: Path, corpus: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\n\xff dog\n")
    out = tmp_path / "out.txt"
    args = ("-m", str(copy_model), "-i", str(corpus), "-i", str(bad), "-o", str(out))
    one_error(nmt("translate", *args, "--ray-address", cluster.address), 1, "bad.txt:2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]
