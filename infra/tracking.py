"""MLflow tracking: one MLflow run per training run (resumed on --resume), SQLite by default."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path


def default_tracking_uri(root: str | Path) -> str:
    return f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= _flatten(v, key + ".")
        else:
            out[key] = str(v)[:6000]
    return out


class Tracker:
    """Thin wrapper over MlflowClient (no global active-run state, safe inside Prefect tasks)."""

    def __init__(self, run_dir: str | Path, root: str | Path, experiment: str, tracking_uri: str | None,
                 params: dict, enabled: bool = True):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        if not enabled:
            return
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri or default_tracking_uri(root)
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = exp_id = exp.experiment_id if exp else self.client.create_experiment(
            experiment, artifact_location=(Path(root).resolve() / "mlartifacts").as_uri())
        id_file = self.run_dir / "mlflow_run_id"
        if id_file.exists() and self._known(id_file.read_text().strip()):
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:  # a new run, or its MLflow run is not in this store (the folder was moved, the database lost)
            run = self.client.create_run(exp_id, run_name=self.run_dir.name, tags={"teamrl.run_dir": str(self.run_dir)})
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id)
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in _flatten(params).items()]
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _known(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def log_metrics(self, metrics: dict[str, float | None], step: int) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, step) for k, v in metrics.items()
              if v is not None and math.isfinite(float(v))]
        for i in range(0, len(ms), 500):
            self.client.log_batch(self.run_id, metrics=ms[i:i + 500])

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        if self.enabled:
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_artifact(self, local_file: str | Path, artifact_path: str) -> None:
        if self.enabled:
            self.client.log_artifact(self.run_id, str(local_file), artifact_path)

    def ui_link(self) -> str:
        """This run's page in the MLflow UI (`make server` serves it; TEAMRL_MLFLOW_UI moves it)."""
        ui = os.environ.get("TEAMRL_MLFLOW_UI", "http://127.0.0.1:5000").rstrip("/")
        return f"{ui}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def register(self, prefix: str, versions: dict[str, int], tags: dict[str, str], success: float | None) -> list:
        """Each agent's checkpoint as a version of registered model <prefix>-<agent> (infra/registry.py)."""
        if not self.enabled:
            return []
        from infra.registry import register_agents

        return register_agents(self.client, self.run_id, prefix, versions, tags | {"teamrl.run_dir": str(self.run_dir)},
                               success)

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.client.set_terminated(self.run_id, status=status)
