"""Fault injection for resume tests: `TEAMRL_FAULT=<point>[:<n>][:raise|hang]`.

By default the process kills itself with SIGKILL the n-th time (default 1st) execution reaches
`crash_point(<point>)`: nothing can clean up, as after an OOM kill or a power cut. With `:raise`,
every hit from the n-th on raises `InjectedFault` instead (so task retries fail too): Prefect records
the flow run as Failed, the case `prefect flow-run retry` is for. With `:hang`, the n-th hit sleeps for
an hour: a stop that does not end, which only a second Ctrl-C or the grace period's watchdog ends.

Points: a DAG stage name (collect_rollouts, extract, coach_evaluate, compute_advantages, resample,
update, stage0_align) fires in the middle of that stage, after its work and before its last table is
written (tasks/stage.py; an update's checkpoint is part of its work);
`partition` fires inside a Parquet write (temp file written, not yet renamed); `checkpoint` inside a
checkpoint write (folder written, not yet renamed into place); `interrupted` where `teamrl train` has
caught the first Ctrl-C, before it reports how to finish the run.
"""

from __future__ import annotations

import os
import signal
import time

_hits: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised by `crash_point` in `raise` mode."""


def crash_point(point: str) -> None:
    spec = os.environ.get("TEAMRL_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    name, nth, how = parts[0], (parts[1:2] or ["1"])[0], (parts[2:3] or ["kill"])[0]
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if how == "raise" and _hits[point] >= int(nth or 1):
        raise InjectedFault(f"TEAMRL_FAULT={spec}: injected failure in {point} (hit {_hits[point]})")
    if how == "hang" and _hits[point] == int(nth or 1):
        time.sleep(3600)
    if how == "kill" and _hits[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
    if how not in ("kill", "raise", "hang"):
        raise ValueError(f"TEAMRL_FAULT={spec}: the action is kill (the default), raise or hang, not {how!r}")
