"""Progress bars on stderr: one look for every command, shown only to a person watching.

`bars()` is the one layout (spinner, label, bar, done/total, elapsed) that prepare's
stages and the counted work of translate and score share. `CountProgress` is one such bar
for counted work (translated lines, bootstrap metrics), transient: when the work ends the
line disappears and the summary takes its place, so logs and pipes never see control
sequences (callers enable it with `Verbosity.progress`: a terminal and no --quiet).
"""

from __future__ import annotations

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


def bars(console: Console, width: int, transient: bool, enabled: bool) -> Progress:
    """The shared progress layout; `width` is the label column's."""
    return Progress(
        SpinnerColumn(),
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
        disable=not enabled,
    )


class CountProgress:
    """`with CountProgress(console, "translate", total, enabled) as p: p.advance(n)`."""

    def __init__(
        self, console: Console, label: str, total: int | None = None, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self._progress = bars(console, 16, transient=True, enabled=enabled)
        self._task: TaskID = self._progress.add_task(label, total=total)

    def __enter__(self) -> CountProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._progress.stop()

    def advance(self, n: int = 1, label: str | None = None) -> None:
        if self.enabled:
            self._progress.update(self._task, advance=n, description=label)
