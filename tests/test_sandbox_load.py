"""Sandbox calls under hostile load (infra/sandbox_slots.py) and calls that fail to start (infra faults).

Runaway programs in some calls must not stop benign calls running at the same time from starting or
change their output; a call that cannot start is retried, then reported as `infra_error`, never as the
program's own failure.
"""

import errno
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra import sandbox, sandbox_process, sandbox_slots
from infra.sandbox import SandboxConfig, run_python
from infra.sandbox_types import INFRA_PREFIX
from tests.test_sandbox import cfg, left_running, mode  # noqa: F401  (the isolation-mode fixture)

RUNAWAY = {
    "fork-bomb": (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.001)"
    ),
    "memory-bomb": (
        "import os\nfor _ in range(4):\n    os.fork()\nx = []\nwhile True:\n"
        "    try:\n        x.append(bytearray(10**7))\n    except MemoryError:\n        pass"
    ),
    "sleeping-children": (
        "import subprocess, sys, time\nwhile True:\n    try:\n"
        "        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True)\n    except OSError:\n        time.sleep(0.01)"
    ),
}
BENIGN = (
    "import os, subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'print({n} * 7)'], "
    "capture_output=True, text=True).stdout.strip(), os.getpid() > 0)"
)


@pytest.mark.timeout(300)
def test_runaway_calls_do_not_stop_concurrent_benign_calls(mode):  # noqa: F811
    """Three runaway programs per kind while 24 benign calls (each spawning a child) run beside them."""
    if mode == "rlimits" and sandbox_slots.budgets() == "shared":
        pytest.skip("without a uid or cgroup per call every call shares one process quota (see sandbox_slots)")
    hostile = cfg(mode, timeout_s=4, memory_mb=128, call_memory_mb=512)  # the same process quota as the benign calls
    benign = cfg(mode, timeout_s=60)
    with ThreadPoolExecutor(max_workers=16) as pool:
        bad = [(kind, pool.submit(run_python, code, hostile)) for kind, code in RUNAWAY.items() for _ in range(3)]
        time.sleep(1.0)  # the runaways are at their limits before the benign calls start
        good = [pool.submit(run_python, BENIGN.format(n=n), benign) for n in range(24)]
        good = [f.result() for f in good]
        bad = [(kind, f.result()) for kind, f in bad]
    for n, r in enumerate(good):
        assert r.ok and r.infra_error is None and r.stdout == f"{n * 7} True\n", r
    for kind, r in bad:  # each runaway ended by its wall clock (or its memory limit), nothing of it left running
        assert r.infra_error is None and not r.ok, r
        assert r.timed_out or (kind == "memory-bomb" and r.memory_killed), (kind, r)
        assert left_running(r.workdir) == []
    if os.geteuid() == 0:  # gone once reaped (an orphan's reaper may lag; the uid's next call waits for it)
        for uid in range(hostile.uid_base, hostile.uid_base + hostile.uid_count):
            deadline = time.monotonic() + 15
            while sandbox_slots.processes_of(uid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sandbox_slots.processes_of(uid) == [], f"processes of sandbox uid {uid} outlived their call"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root trainer runs calls as uids of the pool")
def test_concurrent_calls_hold_distinct_uids():
    code = "import os, time\ntime.sleep(0.5)\nprint(os.getuid())"
    c = SandboxConfig(isolation="rlimits", uid_count=8)
    with ThreadPoolExecutor(max_workers=6) as pool:
        uids = [int(r.stdout) for r in pool.map(lambda _: run_python(code, c), range(6))]
    assert len(set(uids)) == 6 and all(c.uid_base <= u < c.uid_base + 8 for u in uids)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root trainer runs calls as uids of the pool")
def test_a_process_left_behind_by_a_killed_trainer_is_killed_before_its_uid_is_reused():
    c = SandboxConfig(isolation="rlimits", uid_count=1)
    stray = subprocess.Popen(["sleep", "600"], user=c.uid_base, group=c.uid_base, start_new_session=True)
    try:
        r = run_python("print('ok')", c)
        assert r.ok and stray.wait(timeout=10) == -9
    finally:
        stray.kill()


def test_bwrap_that_cannot_create_namespaces_is_an_infra_fault_retried_then_reported(caplog):
    """The fault the issue reported: EAGAIN when bwrap clones (here: a process quota of 1 leaves it no room)."""
    if sandbox.bwrap_problem():
        pytest.skip("needs bubblewrap")
    r = run_python("print(1)", SandboxConfig(isolation="bwrap", max_processes=1, start_retries=2, retry_backoff_s=0.01))
    assert r.infra_error and "Creating new namespace failed" in r.infra_error, r
    assert not r.ok and r.returncode is None and r.stdout == ""
    assert r.feedback().startswith(INFRA_PREFIX) and "ERROR" not in r.feedback()
    assert sum("failed to start" in m for m in caplog.messages) == 3  # the first try and two retries


def test_spawn_failure_is_retried_and_a_recovered_call_runs_normally(mode, monkeypatch):  # noqa: F811
    real, calls = sandbox.subprocess.Popen, []

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) <= 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(*a, **kw)

    monkeypatch.setattr(sandbox.subprocess, "Popen", flaky)
    r = run_python("print(6 * 7)", cfg(mode, retry_backoff_s=0.01))
    assert r.ok and r.stdout == "42\n" and len(calls) == 3


def test_spawn_failure_that_persists_is_reported(mode, monkeypatch):  # noqa: F811
    def broken(*a, **kw):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(sandbox.subprocess, "Popen", broken)
    r = run_python("print(6 * 7)", cfg(mode, start_retries=1, retry_backoff_s=0.01))
    assert r.infra_error == "spawn failed: [Errno 12] Cannot allocate memory" and not r.ok
    assert r.feedback().startswith(INFRA_PREFIX)


def test_missing_interpreter_is_an_infra_fault(mode, monkeypatch, tmp_path):  # noqa: F811
    gone = tmp_path / "python3"
    monkeypatch.setattr(sandbox, "interpreter", lambda *a: str(gone))
    r = run_python("print(1)", cfg(mode, start_retries=0))
    assert r.infra_error == f"interpreter {gone} is missing"


def test_a_failing_shim_step_is_an_infra_fault(mode, monkeypatch):  # noqa: F811
    """Anything between the spawn and the program's start (joining cgroups, rlimits, dropping the uid)."""
    real = sandbox_process._shim
    monkeypatch.setattr(
        sandbox_process, "_shim", lambda *a: [x if not x.startswith("NPROC=") else "NOSUCHLIMIT=1:1" for x in real(*a)]
    )
    r = run_python("print(1)", cfg(mode, start_retries=0))
    assert r.infra_error and "AttributeError" in r.infra_error and "RLIMIT_NOSUCHLIMIT" in r.infra_error


def test_a_program_that_prints_like_an_infra_fault_is_still_its_own_error(mode):  # noqa: F811
    code = (
        "import sys\nsys.stderr.write('bwrap: Creating new namespace failed: Resource temporarily unavailable\\n')\n"
        "sys.exit(1)"
    )
    r = run_python(code, cfg(mode))
    assert r.infra_error is None and r.returncode == 1 and r.feedback().startswith("ERROR: bwrap:")


# Runaways that use up their quotas but hardly any CPU, so the benign programs' timings stay as they
# were (a 2-core machine): forks until refused, children that sleep, memory up to the limit.
QUIET_RUNAWAYS = [
    "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(600)\n"
    "    except OSError:\n        time.sleep(0.5)",
    "import subprocess, time\nwhile True:\n    try:\n"
    "        subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "    except OSError:\n        time.sleep(0.5)",
    "import time\nx = []\ntry:\n    while True:\n        x.append(bytearray(10**6))\nexcept MemoryError:\n"
    "    time.sleep(600)",
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dsbench_rewards_are_the_same_under_hostile_load(prefect_harness, tmp_path):
    """One seeded dsbench-tiny iteration, alone and beside runaway programs in other sandbox calls."""
    import threading

    from flows.config import load_config
    from flows.train import train
    from infra import store
    from tests.conftest import table_content

    if sandbox_slots.budgets() == "shared":
        pytest.skip("without a uid or cgroup per call every call shares one process quota (see sandbox_slots)")

    def run(name):
        return train(
            config=load_config(
                "dsbench-tiny", [f"run.dir={tmp_path}", f"run.id={name}", "iterations=1", "evaluate=false"]
            )
        )

    alone = run("alone")
    stop, hostile_calls = threading.Event(), []

    def hostile():
        c = SandboxConfig(timeout_s=3, memory_mb=128)  # the process quota of dsbench-tiny's calls
        with ThreadPoolExecutor(len(QUIET_RUNAWAYS)) as pool:
            while not stop.is_set():
                hostile_calls.extend(pool.map(lambda code: run_python(code, c), QUIET_RUNAWAYS))

    t = threading.Thread(target=hostile)
    t.start()
    try:
        loaded = run("loaded")
    finally:
        stop.set()
        t.join()
    acts = store.load_actions(loaded, 1, "rollout")
    assert (~acts["tool_output"].str.startswith("NO CODE")).sum() >= 4  # programs did run in the sandbox
    assert table_content(alone, "actions")["tool_output"].equals(table_content(loaded, "actions")["tool_output"])
    for table in ("coach", "advantages"):
        assert table_content(alone, table).equals(table_content(loaded, table)), table
    assert acts["infra_error"].isna().all()
    assert len(hostile_calls) >= 3 and all(r.timed_out for r in hostile_calls)  # they ran beside the iteration


def test_a_host_without_per_call_budgets_is_named_and_warned_about(monkeypatch, caplog):
    monkeypatch.setattr(sandbox_slots.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox_slots, "cgroup_parents", lambda: ())
    sandbox_slots.warn_if_shared.cache_clear()
    try:
        assert sandbox_slots.budgets() == "shared"
        sandbox_slots.warn_if_shared()
        assert any("share one process quota" in m for m in caplog.messages)
    finally:
        sandbox_slots.warn_if_shared.cache_clear()
    monkeypatch.setattr(sandbox_slots.os, "geteuid", lambda: 0)
    assert sandbox_slots.budgets() == "uids"


def test_memory_kills_are_read_from_the_call_cgroups(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for d in (v1, v2):
        d.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert not sandbox_slots.Slot(None, [v1]).memory_killed()
    assert sandbox_slots.Slot(None, [v1, v2]).memory_killed()
    assert not sandbox_slots.Slot(None, []).memory_killed()


def test_groups_of_dead_trainers_are_swept_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"call-{dead.pid}-0a1b2c3d").mkdir()  # a trainer SIGKILLed mid-call
    (tmp_path / f"call-{os.getpid()}-0a1b2c3d").mkdir()  # this process's own call, in use
    (tmp_path / f"call-{dead.pid}-busy").mkdir()
    (tmp_path / f"call-{dead.pid}-busy" / "cgroup.procs").write_text("4242")  # not empty: left alone
    sandbox_slots._sweep_orphans(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"call-{os.getpid()}-0a1b2c3d", f"call-{dead.pid}-busy"]
    )
