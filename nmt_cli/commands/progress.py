"""A progress line for long counted work (translated lines, bootstrap metrics) on stderr.

Shown only to a person watching (`Verbosity.progress`: a terminal and no --quiet), and
transient: when the work ends the line disappears and the summary takes its place, so
logs and pipes never see control sequences.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class CountProgress:
    """`with CountProgress(console, "translate", total, enabled) as p: p.advance(n)`."""

    def __init__(
        self, console: Console, label: str, total: int | None = None, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not enabled,
        )
        self._task: TaskID = self._progress.add_task(label, total=total)

    def __enter__(self) -> CountProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.enabled:
            self._progress.stop()

    def advance(self, n: int = 1, label: str | None = None) -> None:
        if self.enabled:
            self._progress.update(self._task, advance=n, description=label)
