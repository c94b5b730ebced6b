"""The Prefect flow runs that worked on a run folder, and the honest end of those a killed process left.

A process killed by SIGKILL (the OOM killer, a power cut) cannot tell Prefect that its flow run ended: the
flow run, its iteration sub-flow run and the task run it was in stay Running in the UI, and `prefect
flow-run retry` refuses them (it retries finished runs only). So every flow run that takes a run's lock
is recorded in the run folder (`flow_runs`, one id a line). The next one to take the lock knows that no
earlier one is still alive, and marks those still unfinished Crashed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from infra.runs import read_run_config

FILE = "flow_runs"


def record(run_dir: str | Path, flow_run_id: str) -> None:
    """Add a flow run to the run's list; call under the run lock."""
    if flow_run_id not in recorded(run_dir):
        with open(Path(run_dir) / FILE, "a") as fh:
            fh.write(f"{flow_run_id}\n")


def recorded(run_dir: str | Path) -> list[str]:
    """The flow runs recorded for the run, oldest first (a line cut short by a kill is skipped)."""
    p = Path(run_dir) / FILE
    return [line for line in p.read_text().split() if _is_uuid(line)] if p.exists() else []


def _is_uuid(s: str) -> bool:
    try:
        return str(uuid.UUID(s)) == s
    except ValueError:
        return False


def crash_orphans(run_dir: str | Path, current: str, message: str) -> list[str]:
    """Mark Crashed (with `message`) each flow run that worked on the run before `current` (recorded, or
    named in config.yaml as the one that created it) and is still unfinished (Pending, Running or Cancelling),
    with its unfinished sub-flow runs and task runs; returns the ids of the flow runs marked. Call under the
    run lock, which tells that no process that worked on the run is alive. Flow runs this Prefect server does
    not know (another server's, or a lost database) are left alone."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    creator = str(read_run_config(run_dir).get("flow_run_id"))
    earlier = [i for i in dict.fromkeys([creator, *recorded(run_dir)]) if _is_uuid(i) and i != current]
    if not earlier:
        return []
    unfinished = [StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
    flow_state = FlowRunFilterState(type=FlowRunFilterStateType(any_=unfinished))
    with get_client(sync_client=True) as client:
        orphans = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(i) for i in earlier]), state=flow_state)
        )
        if not orphans:
            return []
        subs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[f.id for f in orphans]), state=flow_state
            )
        )
        tasks = client.read_task_runs(
            task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[f.id for f in orphans + subs]),
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=unfinished)),
            )
        )
        for t in tasks:
            client.set_task_run_state(t.id, Crashed(message=message), force=True)
        for f in subs + orphans:
            client.set_flow_run_state(f.id, Crashed(message=message), force=True)
    return [str(f.id) for f in orphans]
