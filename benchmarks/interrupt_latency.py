"""Ctrl-C latency of `teamrl train`: seconds from a SIGINT to the process group (what a terminal's Ctrl-C
sends) to the process's exit, and what the interrupted run kept (docs/operations/faults.md promises an exit
within 10 s, STOP_S in infra/interrupt.py).

    .venv/bin/python benchmarks/interrupt_latency.py [--repeat 3] [--held-store 60] [--no-resume]
        [--at TEXT] [--delay S] [--checkout DIR] [--stacks]

Each repeat starts `teamrl train tiny` in a session of its own (as a terminal starts a foreground job) in a
temporary folder with its own Prefect home, so that it starts its own temporary server as a terminal's run
does. Once the run's first Parquet partition exists (or its log holds `--at`, then `--delay` seconds on), it
sends one SIGINT to the process group with os.killpg and times the process's exit. `--held-store S`: from
3 s before the signal (`--delay 3`) another connection holds the run's MLflow store for S seconds, as
another run sharing the store can while it writes; the run then waits for the store in SQLite's busy handler,
C code that Python's signal handler waits for. Then it reports what the run kept: Parquet partitions, `.tmp-*`
left, the MLflow run's status, the flow run's Prefect state, whether the one-line resume hint was printed,
processes of its Prefect home left, and (unless --no-resume) whether `teamrl train tiny --resume` finishes it.
`--checkout DIR` runs another commit's code (`git archive COMMIT | tar -x -C DIR`) with this venv. `--stacks`
makes the interrupted process dump every thread's stack into its log each second after the signal
(faulthandler on SIGUSR1), to see where a slow stop waits; its exit times are then to the second.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# SIGINT back to Python's default handler (a shell's background job inherits it ignored, and teamrl respects
# that); with --stacks, faulthandler dumps the stacks on SIGUSR1; then the CLI as `python -m flows.cli`
LAUNCHER = """
import faulthandler, os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
if os.environ.get("STACKS_ON_USR1"):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
sys.argv = ["teamrl", *sys.argv[1:]]
runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
"""


def _env(folder: Path, stacks: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TEAMRL_FAULT", "PREFECT_API_URL")}
    env |= {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0", "PREFECT_HOME": str(folder / "prefect")}
    return env | ({"STACKS_ON_USR1": "1"} if stacks else {})


def _train(checkout: Path, folder: Path, extra: list[str], log: Path, stacks: bool) -> subprocess.Popen:
    args = ["train", "tiny", "--set", f"run.dir={folder}", *extra]
    with open(log, "a") as fh:
        return subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, *args],
            env=_env(folder, stacks),
            start_new_session=True,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=checkout,  # `python -c` imports from the working directory first
        )


def _under_way(run_dir: Path, proc: subprocess.Popen, log: Path, at: str, timeout_s: float = 900) -> None:
    """Until the run's log holds `at` or, without `at`, the run has written its first Parquet partition."""
    deadline = time.monotonic() + timeout_s
    while not (at in log.read_text() if at else any(run_dir.rglob("part-*.parquet"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the run ended or never started:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _time_exit(proc: subprocess.Popen, stacks: bool) -> tuple[int, float]:
    """SIGINT to the group, then seconds until the process has exited (and its exit status)."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    while proc.poll() is None:
        if stacks and time.monotonic() - t0 > 1:
            os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.05 if not stacks else 1.0)
    return proc.returncode, time.monotonic() - t0


def left_over(prefect_home: Path) -> list[int]:
    """Processes whose environment names this run's Prefect home (its temporary server, if it outlived it)."""
    needle = f"PREFECT_HOME={prefect_home}".encode()
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and needle in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
        except OSError:
            pass
    return found


def _mlflow_status(folder: Path, run: str) -> list[str]:
    """The MLflow run's status: none where the stop came before the run (or its database) was created."""
    try:
        with sqlite3.connect(folder / "mlflow.db") as db:
            return [s for (s,) in db.execute("SELECT status FROM runs WHERE name = ?", (run,))]
    except sqlite3.OperationalError:
        return []


def _kept(folder: Path, run_dir: Path) -> dict:
    return {
        "partitions": len(list(run_dir.rglob("part-*.parquet"))),
        "tmp_left": len(list(run_dir.rglob(".tmp-*"))),
        "mlflow": _mlflow_status(folder, run_dir.name),
        "interrupted_line": "Finished stages are kept" in (folder / "interrupted.log").read_text(),
    }


def _hold_store(folder: Path, hold_s: float) -> threading.Timer:
    """Take the run's MLflow store as another run's long write would (SQLite's exclusive lock) for `hold_s`."""
    db = sqlite3.connect(folder / "mlflow.db", timeout=60, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(hold_s, lambda: (db.execute("COMMIT"), db.close()))
    release.start()
    return release


def _flow_run_state(folder: Path, run_dir: Path) -> str | None:
    """The Prefect state of the run's flow run on its temporary server's database (None before it began)."""
    try:
        flow_run_id = yaml.safe_load((run_dir / "config.yaml").read_text())["flow_run_id"]
        with sqlite3.connect(folder / "prefect" / "prefect.db") as db:
            return db.execute("SELECT state_type FROM flow_run WHERE id = ?", (flow_run_id,)).fetchone()[0]
    except (OSError, KeyError, TypeError, sqlite3.OperationalError):
        return None


def once(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="interrupt-latency-") as tmp:
        folder = Path(tmp)
        log = folder / "interrupted.log"
        run_dir = folder / "i"
        proc = _train(a.checkout, folder, ["--set", "run.id=i"], log, a.stacks)
        release = None
        try:
            _under_way(run_dir, proc, log, a.at)
            if a.held_store:
                release = _hold_store(folder, a.held_store)
            time.sleep(a.delay)
            rc, took = _time_exit(proc, a.stacks)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)  # the detached server's launcher notices its parent's death within a poll
        if release:
            release.join()
        row = {"exit_s": round(took, 2), "rc": rc, **_kept(folder, run_dir)}
        row["flow_run"] = _flow_run_state(folder, run_dir)
        row["left_over_processes"] = len(left_over(folder / "prefect"))
        if a.stacks:
            print(log.read_text())
        if not a.no_resume:
            resumed = _train(a.checkout, folder, ["--resume", "i"], folder / "resumed.log", False)
            row["resume_rc"] = resumed.wait()
            row["resumed_partitions"] = len(list(run_dir.rglob("part-*.parquet")))
        return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-resume", action="store_true", help="skip the resume of each interrupted run")
    p.add_argument("--at", default="", help="a text the run's log must hold before the signal (a stage's name)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds from that point to the signal")
    p.add_argument("--held-store", type=float, default=0.0, help="seconds another connection holds the MLflow store")
    p.add_argument("--checkout", type=Path, default=REPO, help="the code to run (another commit's checkout)")
    p.add_argument("--stacks", action="store_true", help="dump the stacks each second of a slow stop")
    a = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    for i in range(a.repeat):
        print(f"run {i + 1}: {once(a)}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
