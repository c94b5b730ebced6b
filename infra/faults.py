"""Fault injection for resume tests: `TEAMRL_FAULT=<point>[:<n>]` kills this process with SIGKILL the
n-th time (default 1st) execution reaches `crash_point(<point>)`.

Points: a DAG stage name (collect_rollouts, extract, coach_evaluate, compute_advantages, resample,
update) fires in the middle of that stage, after its work and before its output is written;
`partition` fires inside a Parquet write (temp file written, not yet renamed); `checkpoint` inside a
checkpoint write (folder written, not yet renamed into place).
"""
from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crash_point(point: str) -> None:
    spec = os.environ.get("TEAMRL_FAULT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
