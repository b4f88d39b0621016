"""nmt_cli/heap.py: freed pages handed back, at most once a second."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from nmt_cli.heap import Releaser

GLIBC_LINUX = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
RSS = textwrap.dedent(
    """
    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    """
)


def run_python(code: str) -> list[float]:
    """Run `code` in a fresh interpreter; the numbers it prints."""
    done = subprocess.run(
        [sys.executable, "-c", RSS + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [float(x) for x in done.stdout.split()]


def test_releaser_runs_after_a_chunk_at_most_once_an_interval() -> None:
    now = [100.0]
    calls: list[float] = []
    releaser = Releaser(1.0, clock=lambda: now[0], release=lambda: calls.append(now[0]) or True)
    ran = []
    for t in (100.0, 100.5, 100.99, 101.0, 101.2, 105.0):
        now[0] = t
        ran.append(releaser.after_chunk())
    assert ran == [True, False, False, True, False, True]
    assert calls == [100.0, 101.0, 105.0]


@pytest.mark.skipif(not GLIBC_LINUX, reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """128 MiB of 64 KiB blocks (from the heap, below the mmap threshold) freed under one
    live block: free() cannot shrink the heap past it, release_free_memory can."""
    before, after = run_python(
        """
        from nmt_cli.heap import release_free_memory
        blocks = [bytes([i % 251]) * 65536 for i in range(2048)]
        keep = blocks[-1]
        del blocks
        before = rss_mb()
        assert release_free_memory()
        print(before, rss_mb())
        """
    )
    assert before - after > 64, (before, after)
