"""bench/bench_translate.py on a tiny model: every system runs in a process of its own,
pinned to the layout's cores, CTranslate2's without torch, and the table compares each
nmt measurement (the Translator, the `nmt translate` command) with its peer.

Only what the harness reports is checked, never a speed: timing belongs in bench/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.translation_ckpt import random_checkpoint, sentences, tiny_vocab

pytest.importorskip("ctranslate2")
pytest.importorskip("sacrebleu")

pytestmark = pytest.mark.slow  # the benchmark harness: a process a system, each loading torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_translate.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tiny run: fp32 against CTranslate2 float32, batch 4, one core, one round."""
    tmp = tmp_path_factory.mktemp("bench")
    model = random_checkpoint(tmp / "tiny.pt", tiny_vocab(), max_positions=128)
    lines = tmp / "lines.txt"
    lines.write_text("".join(line + "\n" for line in sentences(6, seed=3)), encoding="utf-8")
    command = [
        sys.executable, str(SCRIPT), str(lines), "--model", str(model), "--ref", str(lines),
        "--precisions", "fp32", "--ct2", "float32", "--batches", "4", "--layouts", "1",
        "--startup-runs", "1", "--skip", "interactive,memory",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_system_runs_pinned_in_its_own_process(report: str) -> None:
    core = min(os.sched_getaffinity(0))
    commands = [line.strip() for line in report.splitlines() if "taskset -c" in line]
    assert len(commands) == 3  # CTranslate2's worker, nmt's worker, the command
    assert all(c.startswith(f"taskset -c {core} ") for c in commands)
    assert any("peer_ct2.py" in c for c in commands)
    assert any("peer_nmt.py" in c for c in commands)
    assert any("-m nmt_cli translate" in c and "--threads 1 --workers 1" in c for c in commands)
    ct2 = next(line for line in report.splitlines() if "library ctranslate2" in line)
    assert f"affinity [{core}]; torch imported: no" in ct2
    nmt = next(line for line in report.splitlines() if "library nmt" in line)
    assert f"affinity [{core}]; torch imported: yes" in nmt


def test_the_timing_of_each_system_is_stated(report: str) -> None:
    for system in ("CT2 float32", "nmt fp32 Translator", "nmt fp32 command"):
        assert f"{system}: timing includes" in report
    assert "on an empty input" in report  # the command's start-up, taken off
    assert "the command's own report of its reading, decoding and writing: " in report


def test_the_table_gives_both_nmt_ratios_to_the_peer(report: str) -> None:
    table = report[report.index("| 1 core, batch 4, 6 sentences") :].splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in table[2:5]}
    assert set(rows) == {"CT2 float32", "nmt fp32 Translator", "nmt fp32 command"}
    number, ratio = r"[\d,]+\.\d", r"\*\*\d+\.\d\dx\*\* CT2 float32 \(\d+\.\d\d\)"
    cells = {name: [c.strip() for c in row.strip("|").split("|")] for name, row in rows.items()}
    for name in ("CT2 float32", "nmt fp32 Translator"):
        assert re.fullmatch(number, cells[name][1]) and re.fullmatch(number, cells[name][3])
    assert cells["CT2 float32"][4] == ""
    assert re.fullmatch(ratio, cells["nmt fp32 Translator"][4])
    # The command's time is its wall time on the six sentences less its start-up, which
    # varies by more than six sentences take: the difference can come out at or below 0.
    # The rule is checked against the two times the report prints: a positive time gives
    # a figure (six sentences over it) and the ratio, none gives "-" and a line saying so.
    wall, startup = map(float, re.findall(r"wall ([\d.]+)s, start-up ([\d.]+)s", report)[0])
    command = cells["nmt fp32 command"]
    row = re.search(r"nmt fp32 command: ([\d.]+) sent/s, .*\(6 sentences in ([\d.]+)s\)", report)
    left_out = "nmt fp32 command: no figure, its start-up varied" in report
    assert left_out == (row is None) == (command[1] == "-")
    if row is not None:  # the table shows the row's figure; the row, six over its time
        sent_s, seconds = float(row.group(1)), float(row.group(2))
        assert command[1] == f"{sent_s:,.1f}" and re.fullmatch(ratio, command[4])
        assert seconds == pytest.approx(wall - startup, abs=0.011)
        assert seconds <= 0.005 or 6 / (seconds + 0.005) <= sent_s <= 6 / (seconds - 0.005)
    else:
        assert command[4] == ""
    if wall - startup > 0.01:  # beyond the rounding of the two printed times
        assert not left_out
    elif wall - startup < -0.01:
        assert left_out
    assert "sacreBLEU signature: nrefs:1" in report


# The harness's rule for the command's figure, on measurements given to it (its own
# timing decides which case a real run is in): run in a child Python from bench/, as the
# script itself runs, with the systems replaced by two whose times are fixed.
FIXED_SYSTEMS = """
import argparse, sys
from pathlib import Path
import bench_translate as bench

def system(name, kind, peer, seconds):
    def run(layout, batch, lines, out):
        outputs = ["x"] * len(lines.read_text(encoding="utf-8").splitlines())
        return bench.Measured(seconds, outputs, None, "run " + name, "details")
    return bench.System(name, kind, peer, run)

chosen = [
    system("CT2 float32", "CT2", "", 0.5),
    system("nmt fp32 command", "command", "CT2 float32", float(sys.argv[1])),
]
bench.systems = lambda args, dirs: chosen
args = argparse.Namespace(ref=None, layouts=[1], batches=[4], single=1, rounds=1, startup_runs=1)
bench.speed(args, ["a b"] * 6, {}, Path(sys.argv[2]))
"""


@pytest.mark.parametrize(
    ("seconds", "printed", "cells", "summary"),
    [
        (
            0.25,
            "round 1, 1 core, batch 4, nmt fp32 command: 24.0 sent/s, - tok/s "
            "(6 sentences in 0.25s); 2.00x CT2 float32",
            "| nmt fp32 command | 24.0 | - | - | **2.00x** CT2 float32 (2.00) |",
            ["| batch 4 | 24.0 | 12.0 |", "| batch 4 | 2.00x |"],
        ),
        (
            0.0,
            "nmt fp32 command: no figure, its start-up varied by more than its decoding took",
            "| nmt fp32 command | - | - | - |  |",
            ["| batch 4 | - | 12.0 |", "| batch 4 | - |"],
        ),
        (
            -0.03,
            "nmt fp32 command: no figure, its start-up varied by more than its decoding took",
            "| nmt fp32 command | - | - | - |  |",
            ["| batch 4 | - | 12.0 |", "| batch 4 | - |"],
        ),
    ],
)
def test_the_command_gets_a_figure_only_for_a_positive_time(
    tmp_path: Path, seconds: float, printed: str, cells: str, summary: list[str]
) -> None:
    """Six sentences in a positive time give six over it and the ratio to the peer's
    (12.0 sent/s); none, the line saying so and an empty row, never a negative speed."""
    done = subprocess.run(
        [sys.executable, "-c", FIXED_SYSTEMS, str(seconds), str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT / "bench", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert printed in lines
    assert "| CT2 float32 | 12.0 | - | - |  |" in lines and cells in lines
    assert [line for line in lines if line.startswith("| batch 4 |")] == summary


EMULATED_ENVIRONMENT = """
import json, os, sys
import bench_translate as bench
for name in ("CT2_USE_MKL", "CT2_FORCE_CPU_ISA", "NMT_CPU_LEVEL"):
    os.environ.pop(name, None)
bench.emulate(sys.argv[1])
print(json.dumps({k: os.environ.get(k) for k in sorted(bench.THREAD_VARIABLES)}))
"""


@pytest.mark.parametrize(
    ("level", "ct2_isa", "ct2_mkl", "mkl"),
    [
        ("avx2", "AVX2", "0", "AVX2"),  # an AMD CPU: CTranslate2 on oneDNN
        ("avx512", "AVX512", None, "AVX512"),  # Intel's: on MKL, without VNNI
        ("avx512_vnni", "AVX512", None, "AVX512_E1"),  # with it
    ],
)
def test_each_emulated_cpu_class_caps_every_system_and_picks_ct2s_backend(
    level: str, ct2_isa: str, ct2_mkl: str | None, mkl: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EMULATED_ENVIRONMENT, level],
        capture_output=True, text=True, cwd=ROOT / "bench", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert env["NMT_CPU_LEVEL"] == level and env["CT2_FORCE_CPU_ISA"] == ct2_isa
    assert env["CT2_USE_MKL"] == ct2_mkl and env["MKL_ENABLE_INSTRUCTIONS"] == mkl
