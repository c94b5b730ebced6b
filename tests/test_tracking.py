"""MLflow tracking (infra/tracking.py): one MLflow run per training run, found again on resume."""
import shutil

from infra.tracking import Tracker


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
