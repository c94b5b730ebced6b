"""DAG stage `extract`: MARS System-1 extraction over bin-packed tool output.

MathChat has no System 1, so the stage passes its partition through unchanged; pipelines with
System-1 agents plug their batched extraction in here.
"""
from __future__ import annotations

from prefect import task

from infra.faults import crash_point
from tasks import context


@task(name="extract")
def extract(run_dir: str, iteration: int, phase: str, rollout_path: str) -> str:
    pipe = context.pipeline(run_dir)
    if any(a.system == 1 for a in pipe.agents):
        raise NotImplementedError(f"pipeline {pipe.name!r} has System-1 agents but no extraction stage")
    crash_point("extract")
    return rollout_path
