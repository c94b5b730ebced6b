"""Ctrl-C (SIGINT to the terminal's whole foreground process group) stops `teamrl train` and `teamrl eval`
within seconds: the flow run is recorded Crashed, the MLflow run KILLED, nothing half-written is left and one
line says how to resume; a second Ctrl-C quits at once. And a flow run left Running by a SIGKILLed process is
marked Crashed when the run is resumed. These run the whole CLI; the Ctrl-C handler on its own, in small
child interpreters, is in test_interrupts_handler.py."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_resume_faults import REPO, _teamrl, assert_same_as_uninterrupted

pytestmark = pytest.mark.slow

STOP_S = 20  # "within a few seconds", generous for a loaded machine
STOPPING = "stopping: the current stage is abandoned"  # what the first Ctrl-C prints (infra/interrupt.py)
# A terminal's foreground job gets Ctrl-C; a shell's background job (`cmd &`, as a CI runner may start the
# suite) inherits SIGINT ignored, which Python and teamrl then respect. The children here are foreground jobs.
FOREGROUND = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


def _env(tmp_path: Path, **extra) -> dict:
    """The CLI's environment: its own Prefect home, so it starts its own temporary server (whose start may
    be slow on a loaded machine)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TEAMRL_FAULT", "PREFECT_API_URL")}
    return (
        env
        | {
            "HF_HUB_OFFLINE": "1",
            "TEAMRL_PROGRESS": "0",
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        }
        | extra
    )


def _start_and_interrupt(
    tmp_path: Path,
    args: list[str],
    signals: int,
    gap_s: float = 0.0,
    env: dict | None = None,
    before: Callable[[], None] | None = None,
):
    """Start `teamrl train args` in its own session (as a terminal starts a foreground job) and, once the
    first Parquet partition of run `i` exists (and `before` has returned), send SIGINT to its process group
    `signals` times `gap_s` apart; returns (exit status, seconds from the last signal to the exit, output)."""
    log = tmp_path / "interrupted.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [
                *FOREGROUND,
                sys.executable,
                "-m",
                "flows.cli",
                "train",
                "tiny",
                "--set",
                f"run.dir={tmp_path}",
                "--set",
                "run.id=i",
                *args,
            ],
            env=_env(tmp_path, **(env or {})),
            start_new_session=True,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 600
            while not list((tmp_path / "i").rglob("part-*.parquet")):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            if before:
                before()
            for n in range(signals):
                if n:  # as a person presses again: once the first Ctrl-C's clean stop says it has begun
                    _wait_for_text(log, STOPPING, proc)
                    time.sleep(gap_s)
                os.killpg(proc.pid, signal.SIGINT)
            t0 = time.monotonic()
            try:
                rc = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                rc = None
            return rc, time.monotonic() - t0, log.read_text()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until `log` holds `text` (the process ending first, or `timeout_s`, fails the test). Under load the
    main thread can sit in C code (a tensor op) long after the kernel delivered the first SIGINT; a second
    one sent then counts as two at once and quits without the clean stop's message, which is right for the
    program but is not the case this test is about."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None, f"ended before printing {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _processes_with(prefect_home: Path, wait_s: float = 15.0) -> list[int]:
    """Processes (after up to `wait_s` for them to end) whose environment holds PREFECT_HOME=prefect_home:
    the CLI's Prefect server among them if it outlived the CLI."""
    from benchmarks.interrupt_latency import left_over

    deadline = time.monotonic() + wait_s
    while True:
        found = left_over(prefect_home)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_ctrl_c_stops_within_seconds_and_resume_finishes(trained_run, tmp_path):
    _, ref_dir = trained_run  # the tiny preset, seed 1, uninterrupted
    rc, took, out = _start_and_interrupt(tmp_path, ["--set", "seed=1"], signals=1)
    assert rc == -signal.SIGINT, f"rc={rc} ({took:.0f} s after the Ctrl-C):\n{out[-3000:]}"
    assert took < STOP_S, out[-3000:]
    assert (
        f"error: interrupted. Finished stages are kept: finish the run with `teamrl train tiny --set "
        f"run.dir={tmp_path} --resume i`"
    ) in out.splitlines(), out[-3000:]
    run_dir = tmp_path / "i"
    assert not list(run_dir.rglob(".tmp-*")), "half-written files were left behind"
    assert not _processes_with(tmp_path / "prefect"), "the temporary Prefect server outlived the CLI"
    # the temporary server recorded how every run ended: nothing is left Running
    flow_run_id = yaml.safe_load((run_dir / "config.yaml").read_text())["flow_run_id"]
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        states = dict(db.execute("SELECT id, state_type FROM flow_run"))
        task_states = {s for (s,) in db.execute("SELECT state_type FROM task_run")}
    assert states[flow_run_id] in ("CRASHED", "CANCELLED"), states
    assert not {"RUNNING", "PENDING"} & (set(states.values()) | task_states), (states, task_states)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("SELECT status FROM runs WHERE name = 'i'").fetchall() == [("KILLED",)]
    # the lock is free and the run finishes as if never interrupted
    rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "i"], tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]
    assert_same_as_uninterrupted(ref_dir, run_dir)


def test_second_ctrl_c_quits_at_once(tmp_path):
    """The clean stop is made to hang where the CLI has caught the first Ctrl-C (a fast machine unwinds within
    the gap between the two presses), so only the second Ctrl-C, or after GRACE_S the watchdog, ends it."""
    rc, took, out = _start_and_interrupt(
        tmp_path, ["--set", "iterations=8"], signals=2, gap_s=0.2, env={"TEAMRL_FAULT": "interrupted:1:hang"}
    )
    assert rc == -signal.SIGINT, f"rc={rc} ({took:.0f} s after the second Ctrl-C):\n{out[-3000:]}"
    assert took < 5, f"the second Ctrl-C waited ({took:.0f} s) for the clean stop or its watchdog:\n{out[-3000:]}"
    assert STOPPING in out, out[-3000:]
    assert "Finished stages are kept" not in out, "the second Ctrl-C waited for the clean stop"
    assert not _processes_with(tmp_path / "prefect"), "the temporary Prefect server outlived the CLI"


def test_ctrl_c_while_the_mlflow_store_is_held_ends_within_the_grace_period(tmp_path):
    """Another run sharing the MLflow store holds it (SQLite's exclusive lock) past the grace period: the
    run's next MLflow write waits in SQLite's busy handler, C code that Python's SIGINT handler waits for (up
    to 20 s), so only a watchdog started at the signal keeps the stop within the grace period (GRACE_S, 10 s;
    started by the handler, it ended the process 27 s after the Ctrl-C). The stop is cut short, as after
    SIGKILL (its resume: test_resume_marks_the_flow_run_of_a_killed_process_crashed)."""
    held = []

    def hold_the_store():
        db = sqlite3.connect(tmp_path / "mlflow.db", timeout=60, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.append(db)
        time.sleep(3)  # the run reaches its next MLflow write and waits for the store

    try:
        rc, took, out = _start_and_interrupt(tmp_path, [], signals=1, before=hold_the_store)
    finally:
        for db in held:
            db.close()  # rolls back, and the store is free again
    assert held, "the store was not taken"
    assert rc == -signal.SIGINT, f"rc={rc} ({took:.0f} s after the Ctrl-C):\n{out[-3000:]}"
    assert took < STOP_S, f"{took:.0f} s after the Ctrl-C: the grace period did not start at the signal"
    assert not list((tmp_path / "i").rglob(".tmp-*")), "half-written files were left behind"
    assert not _processes_with(tmp_path / "prefect"), "the temporary Prefect server outlived the CLI"


def test_resume_marks_the_flow_run_of_a_killed_process_crashed(prefect_harness, tmp_path):
    """SIGKILL in iteration 1's rollouts leaves the flow run, its `iteration-1` sub-flow run and the task run
    Running on the server; `--resume` marks them Crashed, and `prefect flow-run retry` then accepts it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )
    from prefect.settings import PREFECT_API_URL

    api = {"PREFECT_API_URL": PREFECT_API_URL.value()}  # the harness's server, which outlives the kill
    args = [
        "train",
        "tiny",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "run.id=k",
        "--set",
        "iterations=1",
        "--set",
        "evaluate=false",
    ]
    rc, out = _teamrl(args, tmp_path / "killed.log", api | {"TEAMRL_FAULT": "collect_rollouts:1"})
    assert rc == -signal.SIGKILL, f"the fault did not fire (rc={rc}):\n{out[-3000:]}"
    killed = yaml.safe_load((tmp_path / "k" / "config.yaml").read_text())["flow_run_id"]

    def states():  # the killed flow run's, its sub-flow runs' and all their task runs' state types
        with get_client(sync_client=True) as client:
            flows = [client.read_flow_run(killed)]
            flows += client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flows[0].id]))
            )
            tasks = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[f.id for f in flows]))
            )
        return {f.name: f.state_type.value for f in flows}, {t.state_type.value for t in tasks}

    flows, tasks = states()
    assert flows == {"train-mathchat-k": "RUNNING", "iteration-1": "RUNNING"} and "RUNNING" in tasks

    rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "k"], tmp_path / "resumed.log", api)
    assert rc == 0, out[-3000:]
    flows, tasks = states()
    assert flows == {"train-mathchat-k": "CRASHED", "iteration-1": "CRASHED"}
    assert not {"RUNNING", "PENDING"} & tasks, tasks
    assert (tmp_path / "k" / "flow_runs").read_text().split()[0] == killed

    rc, out = _teamrl(
        ["flow-run", "retry", killed, "--entrypoint", "flows/train.py:train"],
        tmp_path / "retry.log",
        api,
        cli=[str(Path(sys.executable).with_name("prefect"))],
    )
    assert rc == 0 and "completed successfully" in out, out[-3000:]


def test_ctrl_c_stops_an_evaluation_too(trained_run, tmp_path):
    """`teamrl eval` runs its flow the same way: a Ctrl-C mid-evaluation stops it within seconds."""
    import shutil

    root, ref_dir = trained_run
    shutil.copytree(ref_dir, tmp_path / "spine")
    log = tmp_path / "eval.log"
    with open(log, "w") as fh:  # iteration 1 was never evaluated: the whole held-out split is played
        proc = subprocess.Popen(
            [
                *FOREGROUND,
                sys.executable,
                "-m",
                "flows.cli",
                "eval",
                "spine",
                "--iteration",
                "1",
                "--dir",
                str(tmp_path),
            ],
            env=_env(tmp_path),
            start_new_session=True,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 300
            while "Beginning flow run" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)
            t0 = time.monotonic()
            rc = proc.wait(timeout=300)
            took = time.monotonic() - t0
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = log.read_text()
    assert rc == -signal.SIGINT and took < STOP_S, f"rc={rc} ({took:.0f} s):\n{out[-3000:]}"
    assert "error: interrupted" in out, out[-3000:]
    assert not list((tmp_path / "spine").rglob(".tmp-*"))
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:  # the server outlived the Ctrl-C to record it
        states = {s for (s,) in db.execute("SELECT state_type FROM flow_run")}
    assert states and states <= {"CRASHED", "CANCELLED", "COMPLETED"} and states != {"COMPLETED"}, states
    assert not _processes_with(tmp_path / "prefect"), "the temporary Prefect server outlived the CLI"
