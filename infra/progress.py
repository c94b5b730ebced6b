"""Progress of rollouts and updates: a rich bar on the console (quiet when TEAMRL_PROGRESS=0) and, inside
a Prefect flow or task run, a progress artifact the Prefect UI shows on that run's page."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, suppress
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PUBLISH_EVERY_S = 5.0  # the least time between two Prefect API calls of one progress artifact


class _PrefectProgress:
    """A Prefect progress artifact, published at most every PUBLISH_EVERY_S seconds and when the stage ends.

    Each publish is an API round trip that the stage waits for. The artifact is created on
    the first publish: a stage shorter than the interval costs one call, its artifact born at its final
    value; a longer one appears after the interval and then moves."""

    def __init__(self, description: str, total: int, every: float = PUBLISH_EVERY_S, clock=time.monotonic):
        self.description, self.total, self.every, self.clock = description, total, every, clock
        self.id: Any = None  # the artifact's id once created
        self.sent: float | None = None
        self.last: float = clock()

    def __call__(self, done: int, final: bool = False) -> None:
        now = self.clock()
        if not final and now - self.last < self.every:
            return
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        self.last, value = now, 100.0 * min(done, self.total) / max(self.total, 1)
        if self.id is None:
            self.id = create_progress_artifact(value, description=self.description)
        elif value != self.sent:
            update_progress_artifact(self.id, progress=value)
        self.sent = value


def _prefect_progress(description: str, total: int) -> _PrefectProgress | None:
    """advance(done) for a Prefect progress artifact, or None outside a Prefect run."""
    from prefect.context import FlowRunContext, TaskRunContext

    if not (TaskRunContext.get() or FlowRunContext.get()):
        return None
    return _PrefectProgress(description, total)


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

    try:
        if os.environ.get("TEAMRL_PROGRESS", "1") == "0":
            yield step
        else:
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=True,
            ) as bar:
                tid = bar.add_task(description, total=total)
                yield lambda n=1: step(n, bar, tid)
    except BaseException:
        if ui:
            with suppress(Exception):  # the stage's own error is the one to see
                ui(done, final=True)
        raise
    if ui:  # a stage that finished early (e.g. the KL early stop) is done all the same
        ui(total, final=True)
