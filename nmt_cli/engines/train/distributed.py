"""Process launch and `torch.distributed` set-up for training on 1..N devices.

Three ways in, one code path after:
- one process (`--gpus 0` or `--gpus 1`): no process group at all;
- `--gpus N` / `--procs N`: this process becomes rank 0 and starts ranks 1..N-1 as
  spawned children on this machine, so rank 0 keeps the caller's progress display;
- `torchrun` (several nodes): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
  are read from the environment and nothing is spawned.
NCCL joins GPU processes, gloo CPU ones. Start-up has a timeout and turns the usual hangs
(a rank that never arrives, no GPU, a busy port) into one clear error.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nmt_cli.errors import NmtError
from nmt_cli.interrupts import stopping


class DistributedError(NmtError):
    """The process group could not be formed or a rank failed."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks: how ranks agree on flags (stop, save)."""
        if not self.distributed:
            return values
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks: how the ranks' shares of the dev loss add up."""
        if not self.distributed:
            return values
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:  # a ReduceOp
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return [float(v) for v in t.tolist()]


@dataclass(frozen=True)
class LaunchSpec:
    """How many processes on which devices; `timeout_s` bounds start-up and collectives."""

    gpus: int = 0
    procs: int = 1  # CPU processes when gpus == 0 (gloo)
    timeout_s: float = 600.0

    @property
    def world(self) -> int:
        return self.gpus if self.gpus > 0 else self.procs


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_devices(spec: LaunchSpec) -> None:
    if spec.gpus < 0 or spec.procs < 1:
        raise DistributedError("--gpus must be >= 0 and --procs >= 1")
    if spec.gpus > 0 and spec.procs > 1:
        raise DistributedError("--procs is for CPU training; with --gpus N, N processes run")
    if spec.gpus > 0 and not under_torchrun():
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < spec.gpus:
            raise DistributedError(
                f"--gpus {spec.gpus} asked for, but {found} CUDA GPU(s) are visible; "
                "use --gpus 0 to train on the CPU"
            )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_process(
    rank: int, world: int, local_rank: int, use_cuda: bool, timeout_s: float
) -> DistContext:
    """Join the process group (when world > 1) and pick this rank's device.

    Everything here runs on CPUs too (gloo; tests/unit/test_train_ddp.py and, under
    torchrun, tests/integration/test_torchrun.py) except the two lines marked GPU only:
    making the rank's GPU the current one, and binding NCCL's communicator to it (gloo
    refuses a device_id that is not an accelerator)."""
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # GPU only
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        try:
            dist.init_process_group(
                backend,
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout_s),
                device_id=device if use_cuda else None,  # GPU only
            )
        except (RuntimeError, ValueError) as exc:  # DistStoreError is a RuntimeError
            addr = os.environ.get("MASTER_ADDR", "?")
            port = os.environ.get("MASTER_PORT", "?")
            raise DistributedError(
                f"rank {rank}/{world} could not join the {backend} process group at "
                f"{addr}:{port} within {timeout_s:.0f} s ({str(exc).splitlines()[0]}); "
                "check that every rank started and MASTER_ADDR/MASTER_PORT are reachable"
            ) from None
    return DistContext(rank=rank, world=world, local_rank=local_rank, device=device)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _child(
    rank: int, world: int, use_cuda: bool, timeout_s: float, fn: Callable[..., Any], args: Any
) -> None:
    try:
        ctx = init_process(rank, world, rank, use_cuda, timeout_s)
        fn(ctx, *args)
    except NmtError as exc:
        print(f"error: rank {rank}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        shutdown()


@contextlib.contextmanager
def _watch(children: list[Any]) -> Iterator[None]:
    """If a child rank dies, rank 0 would wait in its next collective until the timeout;
    instead stop the other ranks and this one at once with the child's exit code. Not
    when a signal stops start-up: the children die of it, and this process exits 128 +
    the signal (nmt_cli/interrupts.py)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            for rank, proc in enumerate(children, start=1):
                if proc.exitcode not in (None, 0):
                    if done.is_set() or stopping():
                        return
                    print(
                        f"error: training rank {rank} exited with code {proc.exitcode}; "
                        "stopping the other ranks (the last checkpoint is intact)",
                        file=sys.stderr,
                        flush=True,
                    )
                    for other in children:
                        if other.exitcode is None:
                            other.terminate()
                    os._exit(1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def launch(
    spec: LaunchSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    main_args: tuple[Any, ...] = (),
) -> Any:
    """Run `fn(ctx, *args)` on every rank; return rank 0's result (in this process).

    Under torchrun this process is one rank among many; otherwise it is rank 0 and the
    other ranks are spawned children. `fn` and `args` must be picklable for children;
    `main_args` (a progress callback, say) go to this process's call only.
    """
    check_devices(spec)
    use_cuda = spec.gpus > 0
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        ctx = init_process(rank, world, local, use_cuda, spec.timeout_s)
        try:
            return fn(ctx, *args, *main_args)
        finally:
            shutdown()
    world = spec.world
    if world == 1:
        return fn(init_process(0, 1, 0, use_cuda, spec.timeout_s), *args, *main_args)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    spawn = mp.get_context("spawn")
    children = [
        spawn.Process(
            target=_child, args=(rank, world, use_cuda, spec.timeout_s, fn, args), daemon=False
        )
        for rank in range(1, world)
    ]
    for proc in children:
        proc.start()
    try:
        with _watch(children):
            ctx = init_process(0, world, 0, use_cuda, spec.timeout_s)
            try:
                result = fn(ctx, *args, *main_args)
            finally:
                shutdown()
        for proc in children:
            proc.join()
        failed = [(r, p.exitcode) for r, p in enumerate(children, 1) if p.exitcode != 0]
        if failed:
            raise DistributedError(
                "training rank(s) failed: "
                + ", ".join(f"rank {r} exit code {c}" for r, c in failed)
            )
        return result
    finally:
        for proc in children:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
