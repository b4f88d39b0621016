"""One writer per directory: a lock file holding the writer's pid and host.

`nmt train` locks its run directory and `nmt prepare` its data directory: two processes
writing the same files would interleave checkpoints, or one would delete the other's
work files mid-stage. The lock is a file created with O_EXCL; a lock whose process is
gone (killed, crashed, a reboot) is taken over, so nothing has to be cleaned up by hand
after a kill.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from nmt_cli.errors import NmtError


class DirLocked(NmtError):
    """Another live process holds the directory's lock."""


class DirLock:
    """`with DirLock(folder / "train.lock", "nmt train", "--run-dir"):` ... ."""

    def __init__(self, path: Path, holder: str, option: str) -> None:
        self.path, self.holder, self.option = path, holder, option

    def acquire(self) -> None:
        """Create the lock file with our pid; take over a lock whose process is gone."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        host = socket.gethostname()
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self.owner()
                if owner is None and _age_seconds(self.path) < 10:
                    time.sleep(0.1)  # just created by a process that is writing its pid
                    continue
                if owner is not None and owner != (os.getpid(), host):
                    pid, owner_host = owner
                    if owner_host != host or _alive(pid):
                        raise DirLocked(
                            f"{self.path.parent} is in use by another {self.holder} (pid {pid} "
                            f"on {owner_host}); stop it, or use another {self.option}. If that "
                            f"process is gone, delete {self.path}"
                        ) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # stale: its process is dead
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()} {host}\n")
            return
        raise DirLocked(f"{self.path}: could not take the lock; try again")

    def release(self) -> None:
        if self.owner() == (os.getpid(), socket.gethostname()):
            self.path.unlink(missing_ok=True)

    def owner(self) -> tuple[int, str] | None:
        try:
            pid_text, _, host = self.path.read_text().strip().partition(" ")
            return int(pid_text), host
        except (OSError, ValueError):
            return None

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _age_seconds(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (dead, not yet reaped) still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
