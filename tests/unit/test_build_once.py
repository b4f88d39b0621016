"""The compiled module is built once per installation and source (backends/cpu/build.py):
a process or worker that finds it built loads it without running the builder, and a
build in progress is visible to every process that waits for it."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from nmt_cli.backends.cpu import build

# Loads the module as nmt does, in a plain process or in a spawned multiprocessing
# worker, and prints the library it loaded.
CHILD = """
import multiprocessing
import sys

def load(queue=None):
    from nmt_cli.backends.cpu.build import load_kernel
    path = load_kernel(lambda text: print("told:", text, file=sys.stderr)).__file__
    if queue is None:
        print("loaded", path, flush=True)
    else:
        queue.put(path)

if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        worker = context.Process(target=load, args=(queue,))
        worker.start()
        print("loaded", queue.get(timeout=600), flush=True)
        worker.join()
        sys.exit(worker.exitcode)
    load()
"""

# Stands for ninja and the compiler: a process that runs either is caught.
TRAP = '#!/bin/sh\necho "$0 $*" >> "{log}"\nexit 1\n'


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        p.name: (p.stat().st_mtime_ns, p.stat().st_size)
        for p in directory.iterdir()
        if p.is_file() and p.name != "build.lock"
    }


@pytest.mark.slow
def test_processes_and_workers_that_find_the_module_built_never_compile(
    kernel: ModuleType, tmp_path: Path
) -> None:
    library = build.library_path()
    assert build.is_built() and kernel.__file__ == str(library)
    before = _snapshot(library.parent)
    ran = tmp_path / "ran.log"
    traps = tmp_path / "bin"
    traps.mkdir()
    for tool in ("ninja", "c++", "cc", "g++", "gcc"):
        (traps / tool).write_text(TRAP.format(log=ran))
        (traps / tool).chmod(0o755)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    env = {**os.environ, "PATH": f"{traps}{os.pathsep}{os.environ.get('PATH', '')}"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    commands = [
        [sys.executable, str(child), "plain"],
        [sys.executable, str(child), "plain"],
        [sys.executable, str(child), "spawn"],
        [*torchrun, "--nproc-per-node", "1", str(child), "plain"],
    ]
    runs = [
        subprocess.Popen(c, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in commands
    ]
    for command, run in zip(commands, runs, strict=True):
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, (command, err.decode()[-2000:])
        assert f"loaded {library}" in out.decode(), (command, out.decode())
        assert "told:" not in err.decode()  # nothing to build, nothing to wait for
    assert not ran.exists(), ran.read_text()
    assert _snapshot(library.parent) == before  # no object, log or library rewritten


def test_a_library_counts_as_built_only_with_the_stamp_of_a_finished_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    library = build.library_path()
    library.parent.mkdir()
    library.write_bytes(b"half a library: its link was killed")
    assert not build.is_built()
    stamp = {"module": library.stem, "torch": torch.__version__, "bytes": library.stat().st_size}
    stamp["mtime_ns"] = library.stat().st_mtime_ns
    (library.parent / "built.json").write_text(json.dumps(stamp))
    assert build.is_built()
    with library.open("ab") as f:  # replaced, or rebuilt by something else, since
        f.write(b"!")
    assert not build.is_built()


def _hold_the_lock(directory: Path) -> subprocess.Popen[str]:
    """A process that holds `directory`'s build lock, as a build would, until killed."""
    script = (
        "import sys, time\nfrom pathlib import Path\nfrom nmt_cli.backends.cpu import build\n"
        "with build._build_lock(Path(sys.argv[1]), print):\n"
        "    print('holding', flush=True)\n    time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_build_leaves_no_lock_behind(tmp_path: Path) -> None:
    holder = _hold_the_lock(tmp_path)
    fd = os.open(tmp_path / "build.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # at once: no age to wait out
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_waiting_process_says_whom_it_waits_for_and_how_far_the_build_is(
    tmp_path: Path,
) -> None:
    holder = _hold_the_lock(tmp_path)
    first, last = build.SOURCES[0], build.SOURCES[-1]
    (tmp_path / f"{first.stem}.o").write_bytes(b"")  # the one object compiled so far
    told: list[str] = []
    waited: list[str | None] = []

    def wait() -> None:
        with build._build_lock(tmp_path, told.append) as holder_seen:
            waited.append(holder_seen)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        _until(lambda: len(told) >= 1)
        (tmp_path / f"{last.stem}.o").write_bytes(b"")
        _until(lambda: len(told) >= 2)
    finally:
        holder.kill()
        holder.wait()
        waiter.join()
    total = len(build.SOURCES)
    head = f"waiting for process {holder.pid}, which is building nmt's CPU kernels"
    assert total == 2  # the step with its bindings, and the kernels
    assert told[0].startswith(head) and f": 1/{total} objects, " in told[0]
    assert told[1].startswith(head) and f": 2/{total} linking, " in told[1]
    assert waited == [f"process {holder.pid}"]
