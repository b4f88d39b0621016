"""What SIGINT and SIGTERM do to `nmt train` before its training loop: stop it at once.

Between updates, training takes a signal in its stride (engines/train/stop.py: finish the
update, save checkpoints/last.pt, exit 130 or 143). Before the first update there is
nothing to save, and start-up can take minutes: building the compiled module (ninja and
a compiler), the CPU layout probe (worker threads in native operations), spawning ranks,
torch.compile. Python runs a signal's handler in the main thread only, between two
bytecodes, so a handler alone waits out whatever native operation is running: one bf16
backward pass emulated on an AVX2 CPU takes over a minute. And a process started with
SIGINT ignored (a background job of a non-interactive shell) never hears Ctrl-C unless it
installs a handler, as the training loop does: without one, such a run would go on
through the whole start-up (a layout probe, a build) after the signal.

`stoppable_startup()` covers the start-up:
- it installs handlers for SIGINT and SIGTERM, over an inherited SIG_IGN as the loop
  does. The first signal sends SIGTERM to every process below this one (the compiler
  under ninja, spawned ranks, compile workers: SIGKILL for those still there after
  `TERM_GRACE_S`) and raises `SignalInterrupt`, a KeyboardInterrupt, so that no
  `except Exception` on the way (a build's, the compiler's fallback) takes it for a
  failure and carries on. Later signals are ignored while it unwinds.
- Around a command (`exit_on_stall`), a watchdog thread hears the signal at once through
  the wakeup fd, even while the main thread sits in native code or waits for threads
  that do, and if the process is still there `STALL_S` later ends it itself: the same
  one-line message (unless the command has printed it), the run's lock released,
  exit 128 + the signal. A Python caller of `train()` keeps its process: no watchdog.
- It turns `SignalInterrupt` into `Interrupted`, naming the phase start-up was in.

Stdlib only: `nmt train` enters it before it imports PyTorch (seconds on a busy machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from nmt_cli.errors import Interrupted

# After a signal, how long the main thread has to unwind before the watchdog ends the process.
STALL_S = 4.0
# Between SIGTERM and SIGKILL for a process below this one that has not gone.
TERM_GRACE_S = 2.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)

Process = tuple[int, int]  # pid and start time: a pid reused meanwhile is another process


class SignalInterrupt(KeyboardInterrupt):
    """A signal that stops start-up at once; `signum` gives the exit code (128 + it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a process from Linux's /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (command) "
    try:  # state is the stat line's field 3, ppid 4, start time 22
        return int(fields[1]), int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def descendants(root: int | None = None) -> list[Process]:
    """The live processes below `root` (this one): children, theirs, and so on. Empty
    where there is no /proc (macOS): there the children's own handling is all there is."""
    root = os.getpid() if root is None else root
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    children: dict[int, list[Process]] = {}
    for name in names:
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[2] != "Z":
                children.setdefault(stat[0], []).append((int(name), stat[1]))
    found: list[Process] = []
    todo = [root]
    while todo:
        for proc in children.get(todo.pop(), []):
            found.append(proc)
            todo.append(proc[0])
    return found


def alive(proc: Process) -> bool:
    stat = _stat(proc[0])
    return stat is not None and stat[1] == proc[1] and stat[2] != "Z"


def _send(procs: list[Process], signum: int) -> None:
    for proc in procs:
        if alive(proc):
            with contextlib.suppress(OSError):
                os.kill(proc[0], signum)


def end_processes(procs: list[Process], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM each (ninja then stops its compilers and drops their half-written
    objects), SIGKILL those still there after `grace_s`."""
    _send(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    _send(procs, signal.SIGKILL)


class StartupGuard:
    """The start-up's signal handling (see the module's text); `phase` says what it is
    doing, for the message and, through `on_phase`, for --verbose."""

    def __init__(self, on_phase: Callable[[str], None] | None, exit_on_stall: bool) -> None:
        self.phase = "loading PyTorch"
        self.signum: int | None = None  # the signal being acted on
        self.ended = False  # training began: the loop's handling from here
        self._raised = False
        self._on_phase = on_phase
        self._exit_on_stall = exit_on_stall
        self._previous: dict[int, Any] = {}
        self._signalled: list[Process] = []
        self._cleanups: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._reported = False
        self._wakeup: socket.socket | None = None  # the write end the signal byte goes to
        self._old_wakeup = -1

    def enter(self, phase: str) -> None:
        self.phase = phase
        if self._on_phase is not None:
            self._on_phase(phase)

    def message(self, signum: int) -> str:
        name = signal.Signals(signum).name
        return f"interrupted by {name} while {self.phase}; no update was made"

    @contextlib.contextmanager
    def cleanup_on_exit(self, cleanup: Callable[[], None]) -> Iterator[None]:
        """Within the block, a forced exit calls `cleanup` first (the run's lock)."""
        self._cleanups.append(cleanup)
        try:
            yield
        finally:
            self._cleanups.remove(cleanup)

    # -- installing and removing ----------------------------------------------------------

    def install(self) -> None:
        try:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals are the caller's business
            return
        if self._exit_on_stall:
            self._start_watchdog()

    def close(self) -> None:
        """Hand signals back as they were (training began, or start-up returned)."""
        with self._lock:
            self.ended = True
        if self._wakeup is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._old_wakeup)
            self._wakeup.close()  # the watchdog reads the end of the stream and returns
            self._wakeup = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    # -- a signal -------------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._raised or self.ended:
            return  # already stopping: the first signal decides, the watchdog bounds it
        self._raised = True
        self._stop_below(signum)
        raise SignalInterrupt(signum)

    def _stop_below(self, signum: int) -> None:
        """Note the signal (the first decides) and SIGTERM every process below this one."""
        with self._lock:
            self.signum = self.signum or signum
        below = descendants()
        self._signalled += below
        _send(below, signal.SIGTERM)

    def interrupted(self, signum: int) -> Interrupted:
        """The error a command reports, once the processes below are gone."""
        with self._lock:
            mine, self._reported = not self._reported, True
        if not mine:  # the watchdog has said it and is ending the process
            while True:
                time.sleep(1)
        end_processes(self._signalled + descendants())
        return Interrupted(self.message(signum), signum)

    def _start_watchdog(self) -> None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            reader.close()
            writer.close()
            return
        self._wakeup = writer
        threading.Thread(
            target=self._watch, args=(reader,), name="nmt-startup-signals", daemon=True
        ).start()

    def _watch(self, reader: socket.socket) -> None:
        with reader:
            while True:
                try:
                    data = reader.recv(64)
                except OSError:
                    return
                if not data:
                    return
                signum = next((b for b in data if b in SIGNALS), None)
                if signum is not None:
                    break
        self._stop_below(signum)  # at once: the main thread may not run its handler for a while
        time.sleep(STALL_S)
        self._force(signum)

    def _force(self, signum: int) -> None:
        """End the process from the watchdog: the main thread did not get out in time."""
        with self._lock:
            if self.ended:
                return
            say, self._reported = not self._reported, True
        end_processes(self._signalled + descendants(), grace_s=1.0)
        for cleanup in list(self._cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        if say:  # straight to the descriptor: the main thread may hold the stream's lock
            with contextlib.suppress(OSError):
                os.write(2, f"error: {self.message(signum)}\n".encode())
        os._exit(128 + signum)


_ACTIVE: StartupGuard | None = None


@contextlib.contextmanager
def stoppable_startup(
    on_phase: Callable[[str], None] | None = None, exit_on_stall: bool = False
) -> Iterator[StartupGuard]:
    """Signals stop the block at once with `Interrupted` (see the module's text) until
    `end_startup()`. Nested, the outer block's guard serves: the command's, around the
    engine's. `exit_on_stall`: the process ends when the block cannot (commands only)."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    guard = _ACTIVE = StartupGuard(on_phase, exit_on_stall)
    guard.install()
    keep = False
    try:
        yield guard
    except SignalInterrupt as exc:
        # A command is ending: its handlers stay, ignoring further signals, and so does
        # the watchdog, which bounds the exit (threads the interpreter would wait for).
        keep = exit_on_stall
        raise guard.interrupted(exc.signum) from None
    finally:
        _ACTIVE = None
        if not keep:
            guard.close()


def startup_phase(text: str) -> None:
    """Start-up enters a phase: the message names it, --verbose shows it."""
    if _ACTIVE is not None and not _ACTIVE.ended:
        _ACTIVE.enter(text)


def end_startup() -> None:
    """Training began: signals go back to the handlers start-up found (the loop's next)."""
    if _ACTIVE is not None and not _ACTIVE.ended:
        _ACTIVE.close()


def stopping() -> bool:
    """Whether a signal is stopping start-up (children dying now are its doing)."""
    return _ACTIVE is not None and _ACTIVE.signum is not None


@contextlib.contextmanager
def cleanup_on_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """`cleanup` runs if the watchdog ends the process within the block."""
    if _ACTIVE is None:
        yield
        return
    with _ACTIVE.cleanup_on_exit(cleanup):
        yield
