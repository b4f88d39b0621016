"""What Ray's exceptions mean to a user of `nmt translate --ray`.

An error raised on a node (a checkpoint that does not load there, a setting its device
refuses) reaches the driver wrapped by Ray Core (`RayTaskError`, `ActorDiedError`) and
again by Ray Data, with the remote traceback in its text. The command reports the
`NmtError` inside as it would on one machine: one line, its exit code.
"""

from __future__ import annotations

from nmt_cli.errors import NmtError


def user_error(exc: BaseException) -> NmtError | None:
    """The `NmtError` that `exc` is or wraps (as Ray's `cause`, as its cause or context),
    if any, with its one line. Ray's wrapper of a remote error is an instance of the
    error's class too (`RayTaskError(CheckpointError)`), its text the remote traceback,
    and Ray Data appends lines about retries to the error inside: its first line is the
    message."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if isinstance(current, NmtError) and not isinstance(cause, BaseException):
            error = NmtError(str(current).split("\n", 1)[0])
            error.exit_code = current.exit_code
            return error
        wrapped = cause if isinstance(cause, BaseException) else None
        todo.extend([wrapped, current.__cause__, current.__context__])
    return None


def connect_error(address: str | None, exc: Exception) -> NmtError:
    """Ray could not be started or reached: one line naming the address."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = f"--ray {address}" if address else "--ray"
    return NmtError(f"{where}: cannot start or reach a Ray cluster ({first})")
