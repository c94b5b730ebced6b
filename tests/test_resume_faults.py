"""Kill the training process (SIGKILL) in the middle of each DAG stage, of a Parquet write and of a
checkpoint write; `teamrl train --resume` then finishes the run with exactly the tables of the
uninterrupted run with the same seed, and consistent checkpoints."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import table_content

from infra.policy import latest_version

pytestmark = pytest.mark.slow
TABLES = ("episodes", "actions", "coach", "advantages", "updates")


def _teamrl(args, log: Path, env_extra=None):
    """Run the CLI in its own session, output to `log` (a pipe would be held open by its Prefect server
    after a SIGKILL); afterwards kill whatever it left behind."""
    env = {k: v for k, v in os.environ.items() if k != "TEAMRL_FAULT"}
    env |= {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"} | (env_extra or {})
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *args], env=env, start_new_session=True,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1])
        try:
            rc = proc.wait(timeout=600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return rc, log.read_text()


@pytest.mark.parametrize("fault", [
    "collect_rollouts:2",     # iteration 1's rollouts generated, actions written, episodes not
    "update:4",               # iteration 2: the solver trained, its checkpoint not written
    "partition:9",            # inside a Parquet write: temp file on disk, not renamed
    "checkpoint:5",           # inside a checkpoint write: folder on disk, not renamed
])
def test_killed_run_resumes_to_identical_tables(fault, trained_run, tmp_path):
    _, ref_dir = trained_run  # the tiny preset, seed 1, uninterrupted
    args = ["train", "tiny", "--set", f"run.dir={tmp_path}", "--set", "run.id=f", "--set", "seed=1"]
    rc, out = _teamrl(args, tmp_path / "killed.log", {"TEAMRL_FAULT": fault})
    assert rc == -signal.SIGKILL, f"the fault did not fire (rc={rc}):\n{out[-3000:]}"
    run_dir = tmp_path / "f"
    rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "f"], tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]
    for table in TABLES:
        pd.testing.assert_frame_equal(table_content(ref_dir, table), table_content(run_dir, table), obj=table)
    for agent in ("solver", "executor", "verifier"):
        assert latest_version(run_dir, agent) == 2
        assert sorted(p.name for p in (run_dir / "checkpoints" / agent).iterdir()) == ["latest", "v0000", "v0001",
                                                                                       "v0002"]
    assert not list(run_dir.rglob(".tmp-*")), "half-written files were left behind"
