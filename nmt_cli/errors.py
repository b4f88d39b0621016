"""The one exception type that means "the user can fix this".

Engines raise `NmtError` for anything a user caused (a bad file, a bad key, an
incompatible checkpoint). The CLI turns it into a one-line message and exit code 1;
anything else is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A failure the user can act on; its message is shown as is, without a traceback."""
