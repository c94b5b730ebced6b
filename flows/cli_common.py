"""What every `teamrl` command shares: the consoles, the one-line errors, the Prefect session, run tables."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.errors import TeamrlError

console = Console(width=None if os.isatty(1) else 160)
err = Console(stderr=True)


def fail(msg: str, code: int = 2) -> NoReturn:
    # one line, however narrow the terminal or log; the message's brackets (`.[gpu]`) are text, not markup
    err.print(f"[bold red]error:[/] {escape(msg)}", soft_wrap=True)
    raise typer.Exit(code)


# what the user can act on (infra/errors.py), and the OS's answers about the paths they named: one line, status 2
USER_ERRORS = (TeamrlError, FileNotFoundError, FileExistsError)


def user_error(e: Exception, finish: str | None = None) -> NoReturn:
    """Exit with `e` as one line; a resumable error raised mid-run says how to `finish` the run."""
    more = (
        f". Finished stages are kept: finish the run with {finish}" if finish and getattr(e, "resumable", False) else ""
    )
    fail(f"{e}{more}")


@contextmanager
def flow_session():
    """Run flows with Prefect's temporary server out of a Ctrl-C's reach (so a flow run can record how it
    ended) and Ctrl-C handling: the first stops within seconds, a second at once (infra/interrupt.py)."""
    from infra.interrupt import stop_on_ctrl_c
    from infra.prefect_server import start_temporary_server

    with stop_on_ctrl_c():
        start_temporary_server()
        yield


def show_table(df, title: str) -> None:
    from flows.report import compact, fmt

    df = compact(df)
    t = Table(title=title)
    for c in df.columns:
        t.add_column(str(c), justify="right")
    for row in df.itertuples(index=False):
        t.add_row(*[fmt(v) for v in row])
    console.print(t)
