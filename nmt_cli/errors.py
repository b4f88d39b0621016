"""The exceptions that mean "the user can fix this", and the exit code each one gets.

Engines raise `NmtError` for anything a user caused (a bad file, a bad key, an
incompatible checkpoint). The CLI turns it into a one-line `error:` message and the
exception's `exit_code`; anything else is a bug. The codes follow the shell's
conventions, so `nmt train ... && nmt average-checkpoints ...` stops where it should:
1 a failure, 2 a usage error (a bad option value), 128 + N a stop by signal N.
"""

from __future__ import annotations

import signal


class NmtError(Exception):
    """A failure the user can act on; its message is shown as is, without a traceback."""

    exit_code = 1


class UsageError(NmtError):
    """An option or argument value the command cannot take (exit code 2, as click's own)."""

    exit_code = 2


class Interrupted(NmtError):
    """Work stopped by a signal after saving what it had: exit 128 + the signal number
    (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process killed by it."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
