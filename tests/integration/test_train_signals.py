"""Ctrl-C and SIGTERM at every moment of `nmt train` (nmt_cli/interrupts.py): during
start-up it stops at once with 128 + the signal, one `error:` line naming the phase, and
no process left behind; during training it saves, then stops, as before.

Each test runs the real command in a process of its own (a new session, so that its
process group is everything it started) on tiny data. To signal it in a given phase
whatever the machine's speed, the process is started through a few lines of Python that
make that phase wait, and say so on stderr, before the signal is sent: the module build
is a shell with children of its own, the layout probe's passes block in native code
(where Python cannot run a signal handler), the data and the model wait in Python.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_train_cli import write_recipe
from unix_helpers import error_line

from nmt_cli.core.checkpoint import load_checkpoint
from tests.fixtures.train_data import make_data_dir, wait_for_updates

pytestmark = [
    pytest.mark.slow,  # every test starts `nmt train` in a process of its own
    pytest.mark.skipif(
        not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc"
    ),
]

# Generous: a 2-core machine shared with other work. Start-up's own bound is seconds.
EXIT_WITHIN_S = 40.0
READY_WITHIN_S = 180.0

# Before the command runs: the compiled module is not built here (its build has tests
# of its own, and the scenario "build" stands in for it).
PRELUDE = """
import ctypes, math, os, subprocess, sys, threading, time
from nmt_cli.engines.train import layout, loop, step

said, saying = set(), threading.Lock()

def say(text):
    # Once a stall: where several threads block (the probe's workers), a second line
    # after the run's error line would not be the last one.
    with saying:
        if text in said:
            return
        said.add(text)
    print("STALL " + text, file=sys.stderr, flush=True)

def native_block(name):
    # A mutex locked twice by one thread: a wait in C that no signal ends, with the
    # interpreter's lock released, as in a long oneDNN product or backward pass. The
    # line comes from another thread once this one is surely in it.
    mutex = ctypes.create_string_buffer(64)
    lock = ctypes.CDLL(None).pthread_mutex_lock
    lock(mutex)
    threading.Timer(0.5, say, (name,)).start()
    lock(mutex)

loop._build_cpu_kernels = lambda on_event: "not built in this test"
"""

STALLS = {
    "build": """
def build(on_event):
    shell = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.5)
    say("build")
    shell.communicate()
    return "unreachable"
loop._build_cpu_kernels = build
""",
    "data": """
real_plan = loop.plan_training
def plan_training(*args):
    say("data")
    time.sleep(600)
    return real_plan(*args)
loop.plan_training = plan_training
""",
    "model": """
def training_objective(*args, **kw):
    say("model")
    time.sleep(600)
loop.training_objective = training_objective
""",
    "ranks": """
def training_objective(*args, **kw):
    native_block("ranks")
loop.training_objective = training_objective
""",
    # the probe of a long run on two cores, whatever this machine has
    "probe-main": """
loop.usable_cpus = lambda: 2
layout.expected_seconds = lambda train, pass_s: math.inf
def forward_backward(*args):
    native_block("probe-main")
layout._forward_backward = forward_backward
""",
    "probe-workers": """
loop.usable_cpus = lambda: 2
layout.expected_seconds = lambda train, pass_s: math.inf
real_pass = layout._forward_backward
def forward_backward(*args):
    if threading.current_thread() is threading.main_thread():
        return real_pass(*args)
    native_block("probe-workers")
layout._forward_backward = forward_backward
""",
    "compile": """
def first_compiled_passes(self, *args):
    say("compile")
    time.sleep(600)
step.Updater._first_compiled_passes = first_compiled_passes
""",
    "training": "",
}

RUN_CLI = """
from nmt_cli.cli import main
sys.argv = ["nmt", *sys.argv[1:]]
main()
"""


class Train:
    """`nmt train` with one phase made to wait; stderr read as it comes."""

    def __init__(
        self,
        stall: str,
        recipe: Path,
        *args: str,
        ignore_sigint: bool = False,
        command_name: str = "train",
    ):
        code = PRELUDE + textwrap.dedent(STALLS[stall]) + RUN_CLI
        self.lines: list[str] = []
        self.ended = False
        self._new_line = threading.Condition()
        command = [sys.executable, "-c", code, command_name, str(recipe), "--verbose", *args]
        if ignore_sigint:  # as a background job of a script starts: SIGINT ignored
            command = ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *command]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "COLUMNS": "300"},
            start_new_session=True,  # its process group: everything it starts
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._new_line:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self.ended = True
            self._new_line.notify_all()

    def wait_for(self, text: str, within: float = READY_WITHIN_S) -> None:
        """Until a line of stderr contains `text` (an empty `text`: until its end)."""
        deadline = time.monotonic() + within
        with self._new_line:
            while not (any(text in line for line in self.lines) if text else self.ended):
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    self.stop()
                    raise AssertionError(f"never saw {text!r}:\n" + "\n".join(self.lines))
                self._new_line.wait(min(left, 0.5))

    def signal_and_wait(self, signum: int) -> float:
        """Send `signum` to the command alone; seconds until it exited."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            self.proc.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"still running {EXIT_WITHIN_S:.0f} s after the signal:\n" + "\n".join(self.lines)
            ) from None
        took = time.monotonic() - sent
        self.wait_for("", within=10)  # the rest of stderr
        return took

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text(errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def assert_nothing_left(pgid: int) -> None:
    deadline = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_members(pgid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    data = make_data_dir(tmp_path / "data")
    return write_recipe(tmp_path, data, tmp_path / "run", steps=100_000)


def interrupted(
    run: Train, signum: int, stall: str, children: int = 0, *, lock: Path | None = None
) -> str:
    """Signal `run` once it waits in `stall` (with more than `children` processes below
    it): it exits at once with 128 + the signal and one line naming the phase, leaving
    no process behind and no lock."""
    run.wait_for(f"STALL {stall}")
    if children:
        assert len(group_members(run.proc.pid)) > children, run.stderr
    run.signal_and_wait(signum)
    assert run.proc.returncode == 128 + signum, run.stderr
    line = error_line(run.stderr)
    name = signal.Signals(signum).name
    assert line.startswith(f"error: interrupted by {name} while "), line
    assert line.endswith("; no update was made"), line
    assert "Traceback" not in run.stderr
    assert_nothing_left(run.proc.pid)
    assert run.proc.stdout is not None and run.proc.stdout.read() == b""
    if lock is not None:
        assert not lock.exists(), "the run directory's lock was left"
    return line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_reading_the_data(recipe: Path, tmp_path: Path, signum: int) -> None:
    run = Train("data", recipe)
    run.wait_for("start-up: reading the data directory")
    line = interrupted(run, signum, "data", lock=tmp_path / "run/train.lock")
    assert "while reading the data directory" in line


def test_sigint_counts_when_started_ignored(recipe: Path, tmp_path: Path) -> None:
    """A background job of a script starts with SIGINT ignored: start-up heard nothing."""
    run = Train("data", recipe, ignore_sigint=True)
    interrupted(run, signal.SIGINT, "data", lock=tmp_path / "run/train.lock")


def test_building_the_module_ends_the_compilers(recipe: Path, tmp_path: Path) -> None:
    """ninja and its compilers stand in: a shell with two children of its own."""
    run = Train("build", recipe)
    line = interrupted(run, signal.SIGINT, "build", children=3, lock=tmp_path / "run/train.lock")
    assert "while loading the CPU kernels" in line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_building_the_model(recipe: Path, tmp_path: Path, signum: int) -> None:
    run = Train("model", recipe)
    line = interrupted(run, signum, "model", lock=tmp_path / "run/train.lock")
    assert "while building the model" in line
    assert not (tmp_path / "run/checkpoints/last.pt").exists()


def test_the_layout_probe_in_native_code(recipe: Path, tmp_path: Path) -> None:
    """The main thread never returns to Python: the watchdog ends the process."""
    run = Train("probe-main", recipe, "--set", "train.threads=0")
    run.wait_for("start-up: measuring the CPU layout (2 threads or 2 processes)")
    line = interrupted(run, signal.SIGINT, "probe-main", lock=tmp_path / "run/train.lock")
    assert "while measuring the CPU layout" in line


def test_nmt_run_stops_the_same_way(recipe: Path, tmp_path: Path) -> None:
    """`nmt run` trains through the same start-up: --verbose names its phases, and a main
    thread in native code is ended by the watchdog, the run's later stages never reached."""
    run = Train(
        "probe-main", recipe, "--from", "train", "--set", "train.threads=0", command_name="run"
    )
    run.wait_for("start-up: measuring the CPU layout (2 threads or 2 processes)")
    line = interrupted(run, signal.SIGINT, "probe-main", lock=tmp_path / "run/train.lock")
    assert "while measuring the CPU layout" in line
    assert not (tmp_path / "run/results.json").exists()


def test_the_layout_probe_waiting_for_its_threads(recipe: Path, tmp_path: Path) -> None:
    """Its worker threads never return; the main thread waits for them."""
    run = Train("probe-workers", recipe, "--set", "train.threads=0")
    line = interrupted(run, signal.SIGTERM, "probe-workers", lock=tmp_path / "run/train.lock")
    assert "while measuring the CPU layout" in line


def test_spawned_ranks_are_ended(recipe: Path, tmp_path: Path) -> None:
    """With --procs 2, rank 1 is a spawned process waiting for rank 0 in a collective,
    and rank 0 is in native code: the watchdog ends rank 1, then this process."""
    run = Train("ranks", recipe, "--procs", "2")
    run.wait_for("start-up: starting 2 training processes")
    line = interrupted(run, signal.SIGINT, "ranks", children=1, lock=tmp_path / "run/train.lock")
    assert "while building the model" in line


def test_compiling_in_the_first_update(recipe: Path, tmp_path: Path) -> None:
    run = Train("compile", recipe, "--set", "train.compile=true")
    line = interrupted(run, signal.SIGINT, "compile", lock=tmp_path / "run/train.lock")
    assert "while compiling the model in the first update" in line
    assert not (tmp_path / "run/checkpoints/last.pt").exists()


def test_during_training_it_saves_then_stops(recipe: Path, tmp_path: Path) -> None:
    run = Train("training", recipe)
    wait_for_updates(tmp_path / "run", 3, within_s=READY_WITHIN_S)
    run.signal_and_wait(signal.SIGINT)
    assert run.proc.returncode == 130, run.stderr
    assert "interrupted: saved checkpoints/last.pt" in run.stderr
    assert error_line(run.stderr).startswith("error: training stopped by signal 2 at step ")
    assert load_checkpoint(tmp_path / "run/checkpoints/last.pt").step >= 3
    assert_nothing_left(run.proc.pid)
