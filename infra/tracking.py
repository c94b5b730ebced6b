"""MLflow tracking: one MLflow run per training run (resumed on --resume), SQLite by default.

Several runs may start together on one store (three seeds at once): the first to arrive creates a SQLite
store's tables while the others wait on a file lock beside it, and a call that finds the database busy
is tried again after a pause."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import math
import os
import queue
import random
import threading
import time
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)
BUSY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # seconds, jittered: after SQLite's own busy timeout (MLflow: 20 s)


def default_tracking_uri(root: str | Path) -> str:
    return f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def _sqlite_path(uri: str) -> Path | None:
    path = uri.split("?", 1)[0].removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    return None if path in ("", ":memory:") else Path(path)


@contextmanager
def store_lock(uri: str):
    """Hold `.<database>.lock` beside a SQLite store (sqlite:///<path>) for the duration, across processes;
    a no-op for other stores, whose server serialises its own schema changes."""
    path = _sqlite_path(uri)
    if path is None:
        yield
        return
    lock = path.parent / f".{path.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _empty_store() -> Path:
    """An empty SQLite store migrated by this MLflow version, made once in teamrl's cache: migrating a new
    database takes seconds, copying a migrated one milliseconds."""
    import mlflow

    from infra.models import cache_root

    template = cache_root() / "mlflow-stores" / f"empty-{mlflow.__version__}.db"
    if template.exists():
        return template
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    def migrate(part: Path) -> None:
        SqlAlchemyStore(f"sqlite:///{part}", default_artifact_root=str(template.parent)).engine.dispose()

    template.parent.mkdir(parents=True, exist_ok=True)
    with store_lock(f"sqlite:///{template}"):
        if not template.exists():
            _write_atomically(template, migrate)
    return template


def _write_atomically(path: Path, write) -> None:
    """`write(part)` a file beside `path`, then rename it to `path`: a reader never sees half a file, and a
    failed write leaves nothing behind."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    try:
        write(part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def create_store(uri: str) -> None:
    """Create a missing SQLite store (sqlite:///<path>) as a copy of the migrated empty one, its default
    experiment's artifacts beside it (<folder>/mlartifacts/0); the caller holds store_lock(uri). Other
    stores, and a store that cannot be copied, are left to MLflow."""
    import shutil
    import sqlite3

    path = _sqlite_path(uri)
    if path is None or path.exists():
        return

    def copy(part: Path) -> None:
        shutil.copyfile(_empty_store(), part)
        with contextlib.closing(sqlite3.connect(part)) as db, db:
            db.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                ((path.parent.resolve() / "mlartifacts" / "0").as_uri(),),
            )

    try:
        _write_atomically(path, copy)
    except (OSError, sqlite3.Error) as e:  # a cache that cannot be written, a full disk: MLflow migrates it
        log.warning("MLflow store %s not copied from the migrated empty store (%s): MLflow creates it", path, e)


class BusyRetry:
    """An MLflow client whose calls are tried again, after growing pauses, while the database is locked by
    another run's write. SQLite rolls back the transaction that found it locked, so a retry writes once."""

    def __init__(self, client, delays: tuple[float, ...] = BUSY_DELAYS):
        self._client, self._delays = client, delays

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            for delay in self._delays:
                try:
                    return attr(*args, **kwargs)
                except Exception as e:
                    if "database is locked" not in str(e):
                        raise
                    pause = delay * random.uniform(0.5, 1.5)  # jittered, so that waiting runs do not collide
                    log.warning("MLflow store busy (database is locked): %s again in %.1f s", name, pause)
                    time.sleep(pause)
            return attr(*args, **kwargs)

        return call


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= _flatten(v, key + ".")
        else:
            out[key] = str(v)[:6000]
    return out


class Tracker:
    """Thin wrapper over MlflowClient (no global active-run state, safe inside Prefect tasks)."""

    def __init__(
        self,
        run_dir: str | Path,
        root: str | Path,
        experiment: str,
        tracking_uri: str | None,
        params: dict,
        enabled: bool = True,
        parent: str | None = None,
    ):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self._trace_jobs: queue.Queue | None = None  # partitions for the trace writer thread, started on first use
        self.trace_seconds = 0.0  # the writer's time so far (it overlaps the next stages)
        if not enabled:
            return
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri or default_tracking_uri(root)
        with store_lock(self.uri):  # a new store's first users would each create its tables
            create_store(self.uri)
            self.client = BusyRetry(MlflowClient(tracking_uri=self.uri))
            self.experiment_id = exp_id = self._experiment(experiment, Path(root).resolve() / "mlartifacts")
        id_file = self.run_dir / "mlflow_run_id"
        if id_file.exists() and self._known(id_file.read_text().strip()):
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:  # a new run, or its MLflow run is not in this store (the folder was moved, the database lost)
            tags = {"teamrl.run_dir": str(self.run_dir)} | ({"mlflow.parentRunId": parent} if parent else {})
            run = self.client.create_run(exp_id, run_name=self.run_dir.name, tags=tags)
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id)
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in _flatten(params).items()]
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i : i + 100])

    def _experiment(self, name: str, artifacts: Path) -> str:
        """The id of experiment `name`, created if new; another process may create it first (a tracking
        server takes no store lock)."""
        from mlflow.exceptions import MlflowException

        if exp := self.client.get_experiment_by_name(name):
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts.as_uri())
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(name).experiment_id

    def _known(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None and math.isfinite(float(v))]
        for i in range(0, len(ms), 500):
            self.client.log_batch(self.run_id, metrics=ms[i : i + 500])

    def log_artifacts(self, local_dir: str | Path, artifact_path: str, exclude: frozenset[str] = frozenset()) -> None:
        """Copy `local_dir` to the run's artifacts, leaving out files named in `exclude`."""
        if not self.enabled:
            return
        if not exclude:
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
            return
        for f in sorted(Path(local_dir).rglob("*")):
            if f.is_file() and f.name not in exclude:
                rel = f.parent.relative_to(local_dir).as_posix()
                self.client.log_artifact(self.run_id, str(f), artifact_path if rel == "." else f"{artifact_path}/{rel}")

    def log_artifact(self, local_file: str | Path, artifact_path: str) -> None:
        if self.enabled:
            self.client.log_artifact(self.run_id, str(local_file), artifact_path)

    def log_traces(self, run_dir: str | Path, iteration: int, phase: str, mode: str, sample: int, seed: int) -> int:
        """Queue the partition's episodes that `mode` chooses (infra/traces.py) for the trace writer thread,
        which writes those not traced before while the run goes on; how many were chosen. A failure is
        logged, not raised: traces never stop training, and a resumed run writes what a stopped one left."""
        if not self.enabled:
            return 0
        from infra import store
        from infra.traces import chosen

        try:
            episodes = chosen(run_dir, iteration, phase, mode, sample, seed)
            n = len(store.read_table(run_dir, "episodes", iteration, phase)) if episodes is None else len(episodes)
        except Exception as e:
            log.warning("could not choose the episodes to trace of iteration %d, %s: %s", iteration, phase, e)
            return 0
        if n:
            if self._trace_jobs is None:
                self._trace_jobs = queue.Queue()
                threading.Thread(
                    target=self._write_traces, args=(self._trace_jobs,), name="teamrl-traces", daemon=True
                ).start()
            self._trace_jobs.put((run_dir, iteration, phase, episodes))
        return n

    def _write_traces(self, jobs: queue.Queue) -> None:
        """The trace writer: one partition at a time, until finish() sends None."""
        from infra.traces import log_partition

        while (job := jobs.get()) is not None:
            run_dir, iteration, phase, episodes = job
            t0 = time.perf_counter()
            try:
                log_partition(self.uri, self.experiment_id, self.run_id, run_dir, iteration, phase, episodes)
            except Exception as e:  # an MLflow store that rejects traces must not cost the run
                log.warning("could not write the traces of iteration %d, %s: %s", iteration, phase, e)
            finally:
                self.trace_seconds += time.perf_counter() - t0
                jobs.task_done()
        jobs.task_done()

    def _stop_traces(self, wait: bool) -> None:
        """Let the writer end: after the queued partitions (`wait`), or after the one it is writing (a stopped
        run leaves the rest to its resume)."""
        jobs, self._trace_jobs = self._trace_jobs, None
        if jobs is None:
            return
        if not wait:
            with contextlib.suppress(queue.Empty):
                while True:
                    jobs.get_nowait()
                    jobs.task_done()
        elif pending := jobs.qsize():
            log.info("writing the MLflow traces of %d more partition(s)", pending)
        jobs.put(None)
        if wait:
            jobs.join()

    def traces_link(self) -> str:
        """The experiment's traces in the MLflow UI; `tags.teamrl.iteration` and `tags.teamrl.phase` filter them."""
        ui = os.environ.get("TEAMRL_MLFLOW_UI", "http://127.0.0.1:5000").rstrip("/")
        return f"{ui}/#/experiments/{self.experiment_id}/traces"

    def ui_link(self) -> str:
        """This run's page in the MLflow UI (`make server` serves it; TEAMRL_MLFLOW_UI moves it)."""
        ui = os.environ.get("TEAMRL_MLFLOW_UI", "http://127.0.0.1:5000").rstrip("/")
        return f"{ui}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def register(self, prefix: str, versions: dict[str, int], tags: dict[str, str], success: float | None) -> list:
        """Each agent's checkpoint as a version of registered model <prefix>-<agent> (infra/registry.py)."""
        if not self.enabled:
            return []
        from infra.registry import register_agents

        with store_lock(self.uri):  # runs finishing together: one at a time creates models and moves `best`
            return register_agents(
                self.client, self.run_id, prefix, versions, tags | {"teamrl.run_dir": str(self.run_dir)}, success
            )

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self._stop_traces(wait=status == "FINISHED")
            self.client.set_terminated(self.run_id, status=status)
