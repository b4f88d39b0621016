"""When training saves and when it stops: steps, time, signals.

The paper saves a checkpoint every 10 minutes and stops after a number of steps
(section 5.2, 6.1); recipes may also cap the training time. Decisions that depend on a
clock or a signal are taken on rank 0 (or any rank that got a signal) and agreed on by
every rank, so all ranks save and stop at the same update.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from nmt_cli.config import TrainConfig
from nmt_cli.interrupts import end_startup


class StopRequest:
    """SIGINT/SIGTERM set a flag that the loop checks between updates; a second SIGINT
    interrupts at once.

    Entering it ends start-up (nmt_cli/interrupts.py), where a signal stops at once:
    there is something to save from here on. With `immediate`, start-up lasts until
    `started()`, which the loop calls after its first update: a compiled model's first
    update is mostly compilation (minutes), and it has nothing to save either."""

    def __init__(self, immediate: bool = False) -> None:
        self.signal: int | None = None
        self._immediate = immediate
        self._installed = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum

    def started(self) -> None:
        """An update is done: from now on a signal waits for the end of one."""
        if self._installed:
            return
        self._installed = True
        end_startup()  # its handlers go first, so that __exit__ restores the ones before
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: no signal handling
            pass

    def __enter__(self) -> StopRequest:
        if not self._immediate:
            self.started()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class TrainingClock:
    """Training time is wall-clock time (validation and saving included), summed over every
    process that worked on the run, so max_time means what a person expects."""

    def __init__(self, elapsed_before: float) -> None:
        self._base = elapsed_before
        self._start = time.monotonic()

    def elapsed(self) -> float:
        return self._base + time.monotonic() - self._start


@dataclass(frozen=True)
class Decision:
    """What to do after an update."""

    stop: str | None  # "signal", "max_steps", "max_time", or None to go on
    save: bool  # write a step checkpoint (with validation) now
    signum: int = 0  # with stop == "signal": which signal (the highest, over ranks)


class StopPolicy:
    """Turns the recipe's limits and intervals into a decision after each update."""

    def __init__(self, tc: TrainConfig) -> None:
        self.tc = tc
        self._last_save = time.monotonic()

    def finished_before_start(self, step: int) -> bool:
        return bool(self.tc.max_steps and step >= self.tc.max_steps)

    def local_flags(self, elapsed_s: float, signalled: int | None, is_main: bool) -> list[float]:
        """This rank's (signal number or 0, save due by time, out of time) flags, to be
        max-reduced over ranks before `decide`; the signal number travels so that every
        rank exits with the code of the signal that stopped the run."""
        tc = self.tc
        time_due = bool(
            tc.save_interval_minutes
            and time.monotonic() - self._last_save >= tc.save_interval_minutes * 60
        )
        out_of_time = bool(tc.max_time_minutes and elapsed_s >= tc.max_time_minutes * 60)
        return [float(signalled or 0), float(time_due and is_main), float(out_of_time and is_main)]

    def decide(self, flags: list[float], step: int, skipped: bool) -> Decision:
        """`flags`: the max over ranks of `local_flags`."""
        signalled, time_due, out_of_time = (bool(f) for f in flags)
        tc = self.tc
        if signalled:
            return Decision("signal", save=False, signum=int(flags[0]))
        if tc.max_steps and step >= tc.max_steps:
            return Decision("max_steps", save=False)
        if out_of_time:
            return Decision("max_time", save=False)
        steps_due = bool(
            tc.save_interval_steps and not skipped and step % tc.save_interval_steps == 0
        )
        return Decision(None, save=steps_due or time_due)

    def saved(self) -> None:
        self._last_save = time.monotonic()
