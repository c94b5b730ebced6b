"""Kill the training process (SIGKILL) in the middle of each DAG stage, of a Parquet write and of a
checkpoint write, or fail a stage so that Prefect records the flow run as Failed; `teamrl train
--resume` (or `prefect flow-run retry`) then finishes the run with exactly the tables of the
uninterrupted run with the same seed (floats to float32 rounding, conftest `assert_same_table`), and
consistent checkpoints."""

import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from conftest import MARS, TEAMTR, assert_same_table, harness_api_env, run_in_session

from infra.policy import latest_version

pytestmark = pytest.mark.slow
TABLES = ("episodes", "actions", "coach", "advantages", "updates")


REPO = Path(__file__).resolve().parents[1]


def _teamrl(args, log: Path, env_extra=None, cli=(sys.executable, "-m", "flows.cli")):
    """Run the CLI (`teamrl args`, or `cli args`) in its own session, output to `log`; against the session's
    Prefect server where one runs (prefect_harness), as with `prefect server start`, so that each command
    does not start a temporary one (tests/test_interrupts.py covers that path)."""
    env = {k: v for k, v in os.environ.items() if k != "TEAMRL_FAULT"}
    env |= {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0", "PREFECT_HOME": str(log.parent / "prefect")}
    return run_in_session([*cli, *args], env | harness_api_env() | (env_extra or {}), log)


# One run killed again and again, each time in the process that resumed it (a fault's count starts anew in each
# process; a stage that resume skips does not reach its point), then resumed to the end.
KILLS = [
    "collect_rollouts:2",  # iteration 1's rollouts generated, actions written, episodes not
    "partition:3",  # inside a Parquet write: temp file on disk, not renamed
    "checkpoint:2",  # inside a checkpoint write: folder on disk, not renamed
    "update:2",  # an agent trained and checkpointed, its `updates` row not written
    "coach_evaluate:1",
    "compute_advantages:1",
]


def test_killed_run_resumed_after_each_kind_of_kill_has_identical_tables(trained_run, tmp_path):
    _, ref_dir = trained_run  # the tiny preset, seed 1, uninterrupted
    args = ["train", "tiny", "--set", f"run.dir={tmp_path}", "--set", "run.id=f", "--set", "seed=1"]
    for i, fault in enumerate(KILLS):
        rc, out = _teamrl(args, tmp_path / f"killed-{i}.log", {"TEAMRL_FAULT": fault})
        assert rc == -signal.SIGKILL, f"{fault} (after {KILLS[:i]}) did not fire (rc={rc}):\n{out[-3000:]}"
        args = ["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "f"]
    rc, out = _teamrl(args, tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]
    assert_same_as_uninterrupted(ref_dir, tmp_path / "f")


def test_killed_in_a_teamtr_resample_resumes_to_identical_tables(teamtr_run, tmp_path):
    """TeamTR (random order, trust region): killed in iteration 1's second resample, after its actions."""
    _, ref_dir = teamtr_run
    sets = [x for kv in ("run.id=t", *TEAMTR) for x in ("--set", kv)]
    rc, out = _teamrl(
        ["train", "tiny", "--set", f"run.dir={tmp_path}", *sets],
        tmp_path / "killed.log",
        {"TEAMRL_FAULT": "resample:2"},
    )
    assert rc == -signal.SIGKILL, f"the fault did not fire (rc={rc}):\n{out[-3000:]}"
    rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "t"], tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]
    assert_same_as_uninterrupted(ref_dir, tmp_path / "t")


def test_failed_flow_run_is_finished_by_prefect_retry(trained_run, tmp_path):
    """A stage that keeps failing (past its task retries) fails the flow run; `prefect flow-run retry`
    reruns that same flow run, which reopens its run folder and skips the finished stages."""
    _, ref_dir = trained_run
    args = ["train", "tiny", "--set", f"run.dir={tmp_path}", "--set", "run.id=p", "--set", "seed=1"]
    rc, out = _teamrl(args, tmp_path / "failed.log", {"TEAMRL_FAULT": "coach_evaluate:3:raise"})
    assert rc != 0 and "InjectedFault" in out, out[-3000:]
    flow_run_id = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())["flow_run_id"]
    rc, out = _teamrl(
        ["flow-run", "retry", flow_run_id, "--entrypoint", "flows/train.py:train"],
        tmp_path / "retry.log",
        cli=[str(Path(sys.executable).with_name("prefect"))],
    )
    assert rc == 0 and "completed successfully" in out, out[-3000:]
    assert_same_as_uninterrupted(ref_dir, tmp_path / "p")
    assert (tmp_path / "p" / "summary.png").exists()


def assert_same_as_uninterrupted(ref_dir: Path, run_dir: Path) -> None:
    for table in TABLES:
        assert_same_table(ref_dir, run_dir, table)
    ref_dir, run_dir = Path(ref_dir), Path(run_dir)
    agents = sorted(p.name for p in (ref_dir / "checkpoints").iterdir())
    assert agents == sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    for agent in agents:
        assert latest_version(run_dir, agent) == latest_version(ref_dir, agent)
        assert sorted(p.name for p in (run_dir / "checkpoints" / agent).iterdir()) == sorted(
            p.name for p in (ref_dir / "checkpoints" / agent).iterdir()
        )
    assert not list(run_dir.rglob(".tmp-*")), "half-written files were left behind"


def test_killed_in_system1_extract_resumes_to_identical_tables(mars_run, tmp_path):
    """MARS: killed inside iteration 1's System-1 extraction (System 2 has acted, nothing is written)."""
    _, ref_dir = mars_run
    args = [
        "train",
        "deepresearch-tiny",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "run.id=m",
        *[x for kv in MARS for x in ("--set", kv)],
    ]
    rc, out = _teamrl(args, tmp_path / "killed.log", {"TEAMRL_FAULT": "extract:1"})
    assert rc == -signal.SIGKILL, f"the fault did not fire (rc={rc}):\n{out[-3000:]}"
    rc, out = _teamrl(
        ["train", "deepresearch-tiny", "--set", f"run.dir={tmp_path}", "--resume", "m"], tmp_path / "resumed.log"
    )
    assert rc == 0, out[-3000:]
    assert_same_as_uninterrupted(ref_dir, tmp_path / "m")
