"""How many CPUs this process may really use, for choosing thread counts.

`os.cpu_count()` counts the machine's cores, not the ones we may run on. A process can be
confined twice over: by its affinity mask (`taskset`, cpusets, a batch scheduler's
binding) and by a CPU quota of its control group (`docker --cpus 2`, Kubernetes limits,
systemd's CPUQuota), which lets it run on every core but only for a share of the time.
Starting more compute threads than either allows makes OpenMP threads wait on
descheduled partners at every barrier: training and decoding then run several times
slower than with the right count. `usable_cpus` is the smaller of the two bounds; train
and translate both take their default thread count from it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all of the machine's where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _ancestors(root: Path, relative: str) -> list[Path]:
    """The cgroup's directory and every parent up to `root`: a limit set higher up
    (a container's, a user slice's) binds every group below it."""
    parts = [p for p in relative.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_limit(root: Path, relative: str) -> float | None:
    """cgroup v2: `cpu.max` holds "QUOTA PERIOD" or "max PERIOD"."""
    limits = []
    for folder in _ancestors(root, relative):
        fields = _read(folder / "cpu.max").split()
        if len(fields) == 2 and fields[0] != "max":
            try:
                quota, period = float(fields[0]), float(fields[1])
            except ValueError:
                continue
            if quota > 0 and period > 0:
                limits.append(quota / period)
    return min(limits) if limits else None


def _v1_limit(folder_root: Path, relative: str) -> float | None:
    """cgroup v1: `cpu.cfs_quota_us` (-1 = none) over `cpu.cfs_period_us`."""
    limits = []
    for folder in _ancestors(folder_root, relative):
        try:
            quota = float(_read(folder / "cpu.cfs_quota_us") or "-1")
            period = float(_read(folder / "cpu.cfs_period_us") or "0")
        except ValueError:
            continue
        if quota > 0 and period > 0:
            limits.append(quota / period)
    return min(limits) if limits else None


def cgroup_cpu_limit(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's control group in CPUs (1.5 = one and a half), or
    None when there is none or it cannot be read."""
    limits: list[float] = []
    for line in _read(proc_cgroup).splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        found: float | None = None
        if hierarchy == "0" and not controllers:  # cgroup v2 (unified)
            for base in (root, root / "unified"):
                found = _v2_limit(base, relative)
                if found is not None:
                    break
        elif "cpu" in controllers.split(","):  # cgroup v1, cpu controller
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                found = _v1_limit(root / name, relative)
                if found is not None:
                    break
        if found is not None:
            limits.append(found)
    return min(limits) if limits else None


def usable_cpus(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int:
    """CPUs this process may keep busy: the affinity mask, bounded by the cgroup quota
    (rounded down, at least 1: with a quota of 1.5 CPUs, two compute threads would be
    throttled every period and wait for each other at every barrier)."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit(proc_cgroup, root)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)
