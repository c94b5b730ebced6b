"""`teamrl sweep`: the sweep file's checks, and experiments/tiny-sweep.yaml (2 variants × 1 iteration of the tiny
preset on its first seed, plus a 4-question problem set) run from the CLI as one parent flow run with a train
sub-flow run per (variant, seed) and nested MLflow runs; killed with SIGKILL in its second run and started
again, it redoes no finished run (its files untouched) and ends with the records of the uninterrupted sweep."""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import FLOAT_ATOL, FLOAT_RTOL, harness_api_env, run_in_session

from flows.sweep_record import RECORD_COLUMNS, read_record
from flows.sweep_spec import load_sweep
from tasks.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny-sweep.yaml"
PARAPHRASED = ROOT / "experiments" / "data" / "mathchat-paraphrased.jsonl"


def sweep_file(tmp: Path, **changes) -> Path:
    """experiments/tiny-sweep.yaml with its runs and records in `tmp`, a 4-question problem set, and `changes`."""
    raw = yaml.safe_load(TINY.read_text())
    (tmp / "four.jsonl").write_text("".join(PARAPHRASED.read_text().splitlines(keepends=True)[:4]))
    raw |= {"runs_dir": str(tmp / "runs"), "records": "records", "problems": {"four": "four.jsonl"}} | changes
    path = tmp / "tiny-sweep.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# --- the sweep file ---------------------------------------------------------------------------------------------


def test_a_sweep_file_resolves_its_paths_and_names_its_runs(tmp_path):
    spec = load_sweep(sweep_file(tmp_path))
    assert spec.records_dir() == tmp_path / "records" and spec.problems == {"four": str(tmp_path / "four.jsonl")}
    assert spec.cells() == [("joint", 0), ("blind", 0), ("joint", 1), ("blind", 1)]  # seed by seed
    assert spec.run_id("blind", 1) == "tiny-sweep-blind-s1"
    assert [(c.a, c.b) for c in spec.contrasts] == [("joint", "blind")]  # [A, B] is short for {a: A, b: B}
    cfg = spec.run_config("blind", 1)
    assert (cfg.seed, cfg.run.id, cfg.iterations, cfg.coach.ground_truth) == (1, "tiny-sweep-blind-s1", 1, False)
    assert cfg.run.dir == str(tmp_path / "runs")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"variants": {"joint": [], "blind": ["seed=3"]}}, "variants.blind: seed are set by the sweep"),
        ({"set": ["run.id=x"]}, "set: run.id are set by the sweep"),
        ({"contrasts": [["joint", "nope"]]}, "contrast [joint, nope]"),
        ({"contrasts": [["joint", "joint"]]}, "two different variants"),
        ({"seeds": [0, 0]}, "seeds must be distinct"),
        ({"concurrency": 2}, "concurrency > 1 needs `deployment`"),
        ({"variants": {"joint": [], "blind": [], "Bad_Name": []}}, "variant names are lowercase"),
        (
            {"variants": {"joint": ["coach.backend=nonsense"], "blind": []}},
            "variant 'joint': invalid config: coach.backend",
        ),
        ({"variants": {"joint": ["nokey"], "blind": []}}, "expected key=value"),
        ({"problems": {"x": "missing.jsonl"}}, "problems.x: no such file"),
        ({"colour": "blue"}, "colour: unknown field"),
    ],
)
def test_a_bad_sweep_file_is_refused_with_what_is_wrong(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_sweep(sweep_file(tmp_path, **changes))


def test_a_missing_or_malformed_sweep_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no sweep file"):
        load_sweep(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_sweep(tmp_path / "bad.yaml")


# --- the sweep, run -------------------------------------------------------------------------------------------


def _teamrl(args, log: Path, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "TEAMRL_FAULT"}
    env |= {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0", "PREFECT_HOME": str(log.parent / "prefect")}
    return run_in_session([sys.executable, "-m", "flows.cli", *args], env | harness_api_env() | (env_extra or {}), log)


@pytest.fixture(scope="module")
def tiny_sweep(prefect_harness, tmp_path_factory):
    """experiments/tiny-sweep.yaml on its first seed (the browser test runs both), uninterrupted, from the CLI."""
    tmp = tmp_path_factory.mktemp("sweep")
    path = sweep_file(tmp, seeds=[0])
    rc, out = _teamrl(["sweep", str(path)], tmp / "sweep.log")
    assert rc == 0, out[-4000:]
    return load_sweep(path), path, out


def records(spec) -> dict[str, pd.DataFrame]:
    return {f.stem: read_record(f) for f in sorted(spec.records_dir().glob("*-s*.csv"))}


slow = pytest.mark.slow


@slow
def test_a_sweep_records_every_run_under_one_parent_flow_run_and_mlflow_run(tiny_sweep):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    spec, _, out = tiny_sweep
    recs = records(spec)
    assert sorted(recs) == ["blind-s0", "joint-s0"]
    for name, df in recs.items():
        assert list(df.columns) == RECORD_COLUMNS
        assert set(df["split"]) == {"heldout", "train", "four"}
        held = df[(df["split"] == "heldout") & (df["metric"] == "success")]
        assert sorted(held["iteration"].unique()) == [0, 1] and len(held) == 2 * 8  # eval_size 8, before and after
        assert len(df[(df["split"] == "four") & (df["metric"] == "success")]) == 4
        assert not df["metric"].str.startswith("seconds/").any()  # wall-clock figures stay out of the record
        meta = json.loads(spec.records_dir().joinpath(f"{name}.json").read_text())
        assert meta["record_version"] == 1 and meta["run_id"] == f"tiny-sweep-{name}" and meta["wall_s"] > 0
    # one parent flow run; each run's train flow run is its sub-flow run
    with get_client(sync_client=True) as client:
        parent = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["sweep-tiny-sweep"])))
        parent = [p for p in parent if spec.runs_dir in str(p.parameters)]
        assert len(parent) == 1 and parent[0].state.is_completed()
        names = [f"train-mathchat-tiny-sweep-{c}" for c in recs]
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)))
        children = [c for c in children if spec.runs_dir in str(c.parameters)]
        assert len(children) == 2 and all(c.state.is_completed() for c in children)
        assert {client.read_task_run(c.parent_task_run_id).flow_run_id for c in children} == {parent[0].id}
    # one MLflow parent run; each run's MLflow run nested under it
    mlflow = MlflowClient(f"sqlite:///{spec.runs_dir}/mlflow.db")
    sweep_id = (Path(spec.runs_dir) / "sweeps" / "tiny-sweep" / "mlflow_run_id").read_text().strip()
    for c in recs:
        child = (Path(spec.runs_dir) / f"tiny-sweep-{c}" / "mlflow_run_id").read_text().strip()
        assert mlflow.get_run(child).data.tags["mlflow.parentRunId"] == sweep_id
    assert mlflow.get_run(sweep_id).info.status == "FINISHED"
    assert "records" in {a.path for a in mlflow.list_artifacts(sweep_id)}
    # the sweep's own report, written at its end
    assert (spec.records_dir() / "report" / "report.md").exists()


@slow
def test_status_shows_each_run_and_a_finished_sweep_started_again_trains_nothing(tiny_sweep, tmp_path):
    spec, path, _ = tiny_sweep
    rc, out = _teamrl(["sweep", str(path), "--status"], tmp_path / "status.log")
    assert rc == 0 and out.count("recorded") == 2, out
    before = {f: f.stat().st_mtime_ns for f in Path(spec.runs_dir).rglob("*.parquet")}
    rc, out = _teamrl(["sweep", str(path)], tmp_path / "again.log")
    assert rc == 0, out[-3000:]
    assert "tiny-sweep-joint-s0 skipped" in out and "Beginning subflow run 'train-" not in out
    assert {f: f.stat().st_mtime_ns for f in Path(spec.runs_dir).rglob("*.parquet")} == before


@slow
def test_a_sweep_killed_in_its_second_run_resumes_it_and_ends_with_the_same_records(tiny_sweep, tmp_path):
    reference, _, _ = tiny_sweep
    path = sweep_file(tmp_path, seeds=[0])
    spec = load_sweep(path)
    # tiny trains 3 agents an iteration: the 5th update is the second of the second run (blind, seed 0)
    rc, out = _teamrl(["sweep", str(path)], tmp_path / "killed.log", {"TEAMRL_FAULT": "update:5"})
    assert rc == -signal.SIGKILL, f"the fault did not fire (rc={rc}):\n{out[-3000:]}"
    assert sorted(records(spec)) == ["joint-s0"]
    rc, out = _teamrl(["sweep", str(path), "--status"], tmp_path / "status.log")
    assert "interrupted" in out and out.count("recorded") == 1, out
    finished = {
        f: (f.stat().st_mtime_ns, f.stat().st_ino)
        for f in (Path(spec.runs_dir) / "tiny-sweep-joint-s0").rglob("*")
        if f.is_file() and f.name != ".lock"
    }
    rc, out = _teamrl(["sweep", str(path)], tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]
    assert "tiny-sweep-blind-s0 resumed" in out and "tiny-sweep-joint-s0 skipped" in out
    assert {f: (f.stat().st_mtime_ns, f.stat().st_ino) for f in finished} == finished  # the finished run untouched
    got, want = records(spec), records(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        a, b = want[name], got[name]
        pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"), obj=name)
        np.testing.assert_allclose(b["value"], a["value"], rtol=FLOAT_RTOL, atol=FLOAT_ATOL, equal_nan=True)
    assert json.loads(spec.records_dir().joinpath("blind-s0.json").read_text())["resumed"] is True


@slow
def test_a_run_started_with_another_config_is_not_resumed_under_the_variants_name(tiny_sweep, tmp_path):
    from flows.sweep import check_same_config
    from infra.errors import UsageError

    spec, _, _ = tiny_sweep
    changed = spec.model_copy(update={"variants": spec.variants | {"blind": ["coach.ground_truth=true"]}})
    with pytest.raises(UsageError, match="was started with another config .*coach"):
        check_same_config(changed, "blind", 0, Path(spec.runs_dir) / "tiny-sweep-blind-s0")
    check_same_config(spec, "blind", 0, Path(spec.runs_dir) / "tiny-sweep-blind-s0")  # its own config passes
