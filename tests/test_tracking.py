"""MLflow tracking (infra/tracking.py): one MLflow run per training run, found again on resume; runs that
start together on a new store."""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.tracking import Tracker

ROOT = Path(__file__).resolve().parents[1]


def test_a_moved_run_folder_gets_a_new_mlflow_run_instead_of_an_error(tmp_path):
    (tmp_path / "a" / "r1").mkdir(parents=True)
    first = Tracker(tmp_path / "a" / "r1", tmp_path / "a", "teamrl", None, {"seed": 1})
    first.log_metrics({"x": 1.0}, step=0)
    first.finish()
    again = Tracker(tmp_path / "a" / "r1", tmp_path / "a", "teamrl", None, {"seed": 1})
    assert again.run_id == first.run_id  # resumed: the same MLflow run
    again.finish()
    shutil.copytree(tmp_path / "a" / "r1", tmp_path / "b" / "r1")  # its MLflow store stays behind
    moved = Tracker(tmp_path / "b" / "r1", tmp_path / "b", "teamrl", None, {"seed": 1})
    assert moved.run_id != first.run_id
    assert (tmp_path / "b" / "r1" / "mlflow_run_id").read_text() == moved.run_id
    moved.log_metrics({"x": 2.0}, step=1)
    assert moved.client.get_run(moved.run_id).data.metrics == {"x": 2.0}
    moved.finish()


STARTER = """
import sys, time
from pathlib import Path
import mlflow.tracking  # imported before the start line, so that the processes reach the store together
from infra.tracking import Tracker
root, i = Path(sys.argv[1]), sys.argv[2]
(root / f"ready-{i}").touch()
while not (root / "go").exists():
    time.sleep(0.005)
tracker = Tracker(root / f"r{i}", root, "teamrl", None, {"seed": i})
tracker.log_metrics({"x": float(i)}, step=0)
tracker.finish()
"""


def test_runs_starting_together_on_a_new_store_all_succeed(tmp_path):
    """Three processes open a store that does not exist yet at the same moment: the first creates its tables
    and the experiment once, under the lock beside the database; none fails, every run is recorded."""
    from mlflow.tracking import MlflowClient

    from infra.tracking import default_tracking_uri

    n = 3
    for i in range(n):
        (tmp_path / f"r{i}").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, str(tmp_path), str(i)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n)
    ]
    try:
        while not all((tmp_path / f"ready-{i}").exists() for i in range(n)):
            assert all(p.poll() is None for p in procs), "a process ended before the start line"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * n, "\n".join(outs)
    client = MlflowClient(default_tracking_uri(tmp_path))
    assert [e.name for e in client.search_experiments()].count("teamrl") == 1
    runs = client.search_runs([client.get_experiment_by_name("teamrl").experiment_id])
    assert sorted(r.data.metrics["x"] for r in runs) == [float(i) for i in range(n)]


def test_calls_on_a_busy_store_are_tried_again_and_other_failures_are_not():
    from mlflow.exceptions import MlflowException

    from infra.tracking import BusyRetry

    calls = []

    class Store:  # what MlflowClient raises while another process writes the SQLite database
        def log_batch(self, run_id, fails=2):
            calls.append(run_id)
            if len(calls) <= fails:
                raise MlflowException("(sqlite3.OperationalError) database is locked")
            return "logged"

        def get_run(self, run_id):
            calls.append(run_id)
            raise MlflowException(f"Run '{run_id}' not found")

    client = BusyRetry(Store(), delays=(0.0, 0.0))
    assert client.log_batch("r") == "logged" and len(calls) == 3
    calls.clear()
    with pytest.raises(MlflowException, match="not found"):
        client.get_run("x")
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(MlflowException, match="database is locked"):  # still busy after every pause
        client.log_batch("r", fails=5)
    assert len(calls) == 3


def test_a_new_store_is_a_copy_of_the_migrated_empty_one_and_matches_what_mlflow_creates(tmp_path, monkeypatch):
    """create_store copies an empty store migrated once per MLflow version (in teamrl's cache) instead of
    migrating each new database: the copy has MLflow's own tables and schema version, and its default
    experiment keeps its artifacts beside the store."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    from infra.tracking import create_store, default_tracking_uri, store_lock

    monkeypatch.setenv("TEAMRL_CACHE", str(tmp_path / "cache"))
    MlflowClient(default_tracking_uri(tmp_path / "mlflow")).search_experiments()  # migrated by MLflow itself

    # tables, their columns, indexes and schema version (migrations order a table's constraints at will)
    def schema(db: Path) -> tuple:
        with sqlite3.connect(db) as c:
            names = c.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index') ORDER BY name")
            names = names.fetchall()
            columns = {n: c.execute(f"PRAGMA table_info('{n}')").fetchall() for t, n in names if t == "table"}
            return names, columns, c.execute("SELECT version_num FROM alembic_version").fetchall()

    for name in ("a", "b"):
        uri = default_tracking_uri(tmp_path / name)
        with store_lock(uri):
            create_store(uri)
        (template,) = (tmp_path / "cache" / "mlflow-stores").glob("empty-*.db")
        if name == "a":
            made = template.stat().st_mtime_ns
        assert template.stat().st_mtime_ns == made  # migrated once, then only copied
        assert schema(tmp_path / name / "mlflow.db") == schema(tmp_path / "mlflow" / "mlflow.db")
        (default,) = MlflowClient(uri).search_experiments()
        assert (default.name, default.artifact_location) == ("Default", (tmp_path / name / "mlartifacts/0").as_uri())
    assert not list(tmp_path.rglob("*.part"))
    Tracker(tmp_path / "a", tmp_path / "a", "teamrl", None, {"seed": 0}).finish()  # MLflow takes the copy as is
    with store_lock(uri):
        create_store(uri)  # an existing store is left as it is
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]


def test_a_store_that_cannot_be_copied_is_created_by_mlflow(tmp_path, monkeypatch, caplog):
    """A cache that cannot be written (here a file where its folder should be) costs the copy, never the run."""
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("TEAMRL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "r").mkdir()
    tracker = Tracker(tmp_path / "r", tmp_path, "teamrl", None, {"seed": 0})
    tracker.log_metrics({"x": 1.0}, step=0)
    assert tracker.client.get_run(tracker.run_id).data.metrics == {"x": 1.0}
    tracker.finish()
    assert "not copied from the migrated empty store" in caplog.text
    assert not list(tmp_path.rglob("*.part"))
