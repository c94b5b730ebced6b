"""Rich progress bars for rollouts and updates (quiet when TEAMRL_PROGRESS=0)."""
from __future__ import annotations

import os
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(description: str, total: int):
    """Yields advance(n=1); draws a bar on the console unless TEAMRL_PROGRESS=0."""
    if os.environ.get("TEAMRL_PROGRESS", "1") == "0":
        yield lambda n=1: None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True) as bar:
        tid = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(tid, n)
