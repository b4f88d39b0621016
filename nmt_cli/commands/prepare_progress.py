"""Rich progress bars for `nmt prepare`'s stage events (the engine knows nothing of rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import TaskID

from nmt_cli.commands.progress import bars
from nmt_cli.engines.prepare import StageEvent


class StageProgress:
    """One bar per stage step ("clean train", "binarize valid", ...), driven by events."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        """`enabled` False (--quiet): the events are taken and nothing is shown."""
        self.enabled = enabled
        self._progress = bars(console, 24, transient=False, enabled=enabled)
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> StageProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def __call__(self, event: StageEvent) -> None:
        if not self.enabled:
            return
        if event.kind == "skip":
            self._progress.console.print(f"[dim]{event.label}[/]")
        elif event.kind == "start":
            self._tasks[event.label] = self._progress.add_task(event.label, total=event.total)
        elif event.kind == "advance" and event.label in self._tasks:
            self._progress.advance(self._tasks[event.label], event.advance)
        elif event.kind == "end" and event.label in self._tasks:
            task = self._tasks[event.label]
            done = self._progress.tasks[self._progress.task_ids.index(task)].completed
            self._progress.update(task, total=done, completed=done)
