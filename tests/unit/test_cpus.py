"""The CPUs a process may use: its affinity mask bounded by its cgroup's CPU quota
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), read from fake /proc and /sys trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nmt_cli import cpus


def tree(root: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    proc = root / "proc_cgroup"
    proc.write_text(proc_line + "\n")
    sys_root = root / "sys"
    for rel, text in files.items():
        path = sys_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return proc, sys_root


@pytest.mark.parametrize(
    ("proc_line", "files", "limit"),
    [
        ("0::/", {"cpu.max": "max 100000"}, None),  # v2, no quota
        ("0::/", {"cpu.max": "150000 100000"}, 1.5),  # docker --cpus 1.5
        ("0::/user.slice/job", {"user.slice/cpu.max": "300000 100000"}, 3.0),  # a parent's
        (
            "0::/a/b",
            {"a/cpu.max": "400000 100000", "a/b/cpu.max": "200000 100000"},
            2.0,
        ),  # the tightest on the path
        ("0::/", {"unified/cpu.max": "100000 100000"}, 1.0),  # hybrid layout
        ("4:cpu,cpuacct:/job", {"cpu,cpuacct/job/cpu.cfs_quota_us": "-1"}, None),  # v1, none
        (
            "4:cpu,cpuacct:/job",
            {
                "cpu,cpuacct/job/cpu.cfs_quota_us": "250000",
                "cpu,cpuacct/job/cpu.cfs_period_us": "100000",
            },
            2.5,
        ),
        (
            "1:cpu:/",
            {"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"},
            0.5,
        ),
        ("0::/", {"cpu.max": "garbage"}, None),  # unreadable: no limit rather than a crash
    ],
)
def test_cgroup_cpu_limit(
    tmp_path: Path, proc_line: str, files: dict[str, str], limit: float | None
) -> None:
    proc, root = tree(tmp_path, proc_line, files)
    assert cpus.cgroup_cpu_limit(proc, root) == limit


def test_usable_cpus_is_the_affinity_bounded_by_the_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    proc, root = tree(tmp_path, "0::/", {"cpu.max": "250000 100000"})
    assert cpus.usable_cpus(proc, root) == 2  # 2.5 CPUs: two threads, never throttled
    proc, root = tree(tmp_path / "small", "0::/", {"cpu.max": "20000 100000"})
    assert cpus.usable_cpus(proc, root) == 1
    proc, root = tree(tmp_path / "none", "0::/", {"cpu.max": "max 100000"})
    assert cpus.usable_cpus(proc, root) == 8
    assert cpus.usable_cpus(tmp_path / "missing", tmp_path / "missing") == 8


def test_the_affinity_mask_is_respected() -> None:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity on this platform")
    import torch

    from nmt_cli.engines.translate.loading import set_threads

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {min(before)})
        assert cpus.affinity_cpus() == 1
        assert set_threads(0, 0)[0] == 1  # translate's default follows it
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
