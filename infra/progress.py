"""Progress of rollouts and updates: a rich bar on the console (quiet when TEAMRL_PROGRESS=0) and, inside
a Prefect flow or task run, a progress artifact the Prefect UI shows on that run's page."""
from __future__ import annotations

import os
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def _prefect_progress(description: str, total: int):
    """advance(done) for a Prefect progress artifact, or None outside a Prefect run."""
    from prefect.context import FlowRunContext, TaskRunContext

    if not (TaskRunContext.get() or FlowRunContext.get()):
        return None
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    aid = create_progress_artifact(0.0, description=description)

    def advance(done: int) -> None:
        update_progress_artifact(aid, progress=100.0 * min(done, total) / max(total, 1))
    return advance


@contextmanager
def progress_bar(description: str, total: int):
    """Yields advance(n=1): moves the console bar (unless TEAMRL_PROGRESS=0) and the Prefect artifact, which
    ends at 100% when the block completes and stays where it was when the block raises."""
    ui = _prefect_progress(description, total)
    done = 0

    def step(n: int = 1, bar=None, tid=None) -> None:
        nonlocal done
        done += n
        if bar is not None:
            bar.advance(tid, n)
        if ui:
            ui(done)

    if os.environ.get("TEAMRL_PROGRESS", "1") == "0":
        yield step
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), transient=True) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda n=1: step(n, bar, tid)
    if ui and done < total:  # the stage finished early (e.g. the KL early stop): it is done all the same
        ui(total)
