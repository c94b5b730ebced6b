"""The base of every error teamrl raises about what a user asked for or about the machine it runs on.

A `TeamrlError` is an answer, not a crash: the CLI prints its message as one line and exits with status 2
(flows/cli.py), without a traceback, so its message must say what is wrong and what to do. Faults that
retries absorb (infra/retry.py) and bugs are not TeamrlErrors.
"""


class TeamrlError(Exception):
    """A problem the user can act on: bad input, a run folder in the wrong state, a missing dependency."""

    # raised mid-run by what the user can fix (disk space, an endpoint, a library) and then `--resume`
    resumable: bool = False


class UsageError(TeamrlError, ValueError):
    """Bad input: a file, option or name the user gave; the message names it and what is accepted."""
