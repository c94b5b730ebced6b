"""The sweep flow: one parent flow run `sweep-<name>` whose children are the train flow runs of every
(variant, seed) of a sweep file (flows/sweep_spec.py), each as run `<name>-<variant>-s<seed>`.

A run whose record exists is skipped; one whose folder exists is resumed (`teamrl train --resume`), so a
sweep killed at any point and started again redoes no finished stage. When a run ends, its final team
plays the sweep's extra problem sets, and its record is written (flows/sweep_record.py): that record is
what `teamrl report` reads, and what a lab commits as the run's result.

In this process the runs train one after another, as sub-flow runs. With `deployment`, each becomes a flow
run of that train deployment, which its work pool's workers pick up, at most `concurrency` at once (a Prefect
global concurrency limit, `sweep-<name>`), and the parent waits for them.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task

from flows.evaluate import evaluate, problems_team
from flows.sweep_record import provenance, record_paths, run_record, write_record
from flows.sweep_spec import SweepSpec
from flows.train import artifact_key
from flows.train import train as train_flow
from infra import runs
from infra.errors import UsageError
from infra.tracking import Tracker
from tasks import context
from tasks.config import moved_to_pipeline


def sweep_folder(spec: SweepSpec) -> Path:
    """Where the sweep's own state lives beside its runs: its MLflow run id."""
    return Path(spec.runs_dir) / "sweeps" / spec.name


def parent_tracker(spec: SweepSpec) -> Tracker:
    """The sweep's MLflow run (the parent of every run's), made once and reopened after."""
    cfg = spec.run_config(*spec.cells()[0])
    folder = sweep_folder(spec)
    folder.mkdir(parents=True, exist_ok=True)
    return Tracker(
        folder,
        spec.runs_dir,
        cfg.run.experiment,
        cfg.run.tracking_uri,
        spec.model_dump(mode="json"),
        enabled=cfg.run.mlflow,
    )


def check_same_config(spec: SweepSpec, variant: str, seed: int, run_dir: Path) -> None:
    """A run folder left by an earlier sweep must have been started with this sweep's config for it, or
    resuming it would record another experiment under this variant's name."""
    want = spec.run_config(variant, seed).model_dump(mode="json")
    have = moved_to_pipeline(runs.read_run_config(run_dir))  # as a resume reads it
    skip = {*context.RUN_KEYS, "run"}
    differ = sorted(k for k in set(want) | set(have) if k not in skip and want.get(k) != have.get(k))
    if differ:
        raise UsageError(
            f"run {run_dir.name} was started with another config ({', '.join(differ)} differ from the sweep's): "
            f"move {run_dir} away, or give the changed variant a new name"
        )


def play_problem_sets(spec: SweepSpec, run_dir: Path) -> dict[str, Path]:
    """Each extra problem set played by the run's final team, in folder `<run id>.<set>` (made once, then
    reused; finished partitions are not replayed)."""
    from flows.evaluate import last_iteration

    out = {}
    for name, file in spec.problems.items():
        folder = run_dir.parent / f"{run_dir.name}.{name}"
        if folder.exists() and not (folder / "config.yaml").exists():  # a copy a crash cut short: no run yet
            import shutil

            shutil.rmtree(folder)
        if not folder.exists():
            problems_team(str(run_dir.parent), run_dir, last_iteration(run_dir), file, run_id=folder.name)
        with runs.run_lock(folder):
            evaluate(str(folder), 0)
        out[name] = folder
    return out


def train_in_pool(spec: SweepSpec, variant: str, seed: int, parent: str | None) -> None:
    """Run (variant, seed) as a flow run of the sweep's train deployment and wait for it, holding one slot of
    the sweep's concurrency limit meanwhile."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.concurrency.sync import concurrency
    from prefect.deployments import run_deployment

    cfg, rid = spec.run_config(variant, seed, parent), spec.run_id(variant, seed)
    run_dir = Path(spec.runs_dir) / rid
    while runs.is_locked(run_dir):  # a flow run an earlier sweep started still trains it: let it end first
        time.sleep(10)
    resume = rid if (run_dir / "config.yaml").exists() else None
    with concurrency(f"sweep-{spec.name}", occupy=1, strict=True):
        fr = run_deployment(
            spec.deployment,
            parameters={"config": cfg.model_dump(mode="json"), "resume": resume},
            flow_run_name=f"train-{cfg.pipeline.name}-{rid}",
            tags=["teamrl", f"sweep:{spec.name}"],
            as_subflow=True,
        )
    if not isinstance(fr, FlowRun):  # the coroutine of an async caller: this flow is sync
        raise TypeError(f"run_deployment gave {type(fr).__name__}, not a FlowRun")
    if not fr.state or not fr.state.is_completed():
        raise RuntimeError(f"{rid}: flow run {fr.name} ended {fr.state.name if fr.state else 'unknown'}")


@task(name="record-run", task_run_name="record-{variant}-s{seed}")
def finish_run(spec: SweepSpec, variant: str, seed: int, wall_s: float, resumed: bool) -> str:
    """Play the extra problem sets and write the run's record; the record's path."""
    run_dir = Path(spec.runs_dir) / spec.run_id(variant, seed)
    sets = play_problem_sets(spec, run_dir)
    csv, meta = record_paths(spec, variant, seed)
    info = provenance(spec, variant, seed, wall_s, resumed)
    write_record(run_record(run_dir, sets), info, csv, meta)
    return str(csv)


def run_cell(spec: SweepSpec, variant: str, seed: int, parent: str | None) -> str:
    """Train (or resume) one run and record it; `skipped` where its record exists."""
    csv, _ = record_paths(spec, variant, seed)
    if csv.exists():
        get_run_logger().info("%s: recorded, skipped", spec.run_id(variant, seed))
        return "skipped"
    run_dir = Path(spec.runs_dir) / spec.run_id(variant, seed)
    resumed = (run_dir / "config.yaml").exists()
    if resumed:
        check_same_config(spec, variant, seed, run_dir)
    t0 = time.perf_counter()
    if spec.deployment:
        train_in_pool(spec, variant, seed, parent)
    else:
        cfg = spec.run_config(variant, seed, parent)
        train_flow(config=cfg, resume=cfg.run.id if resumed else None)
    finish_run(spec, variant, seed, time.perf_counter() - t0, resumed)
    return "resumed" if resumed else "trained"


# with a deployment, each run waits for its flow run in a thread of the flow's task runner
pooled_cell = task(name="run", task_run_name="run-{variant}-s{seed}")(run_cell)


def _sweep_run_name() -> str:
    from prefect.runtime import flow_run

    spec = flow_run.parameters["spec"]
    return f"sweep-{spec['name'] if isinstance(spec, dict) else spec.name}"


@flow(name="sweep", flow_run_name=_sweep_run_name, log_prints=True)
def sweep(spec: SweepSpec) -> dict[str, str]:
    """Train every (variant, seed) of the sweep, seed by seed, each as its own train flow run; run id ->
    what happened to it (trained, resumed, skipped)."""
    Path(spec.runs_dir).mkdir(parents=True, exist_ok=True)
    if spec.deployment:  # the workers start in their own folder: they must find the runs where this process does
        spec = spec.model_copy(update={"runs_dir": str(Path(spec.runs_dir).resolve())})
    tracker = parent_tracker(spec)
    parent = tracker.run_id if tracker.enabled else None
    done: dict[str, str] = {}
    try:
        if spec.deployment:
            ensure_limit(spec)
            futures = {spec.run_id(v, s): pooled_cell.submit(spec, v, s, parent) for v, s in spec.cells()}
            done = {rid: f.result() for rid, f in futures.items()}
        else:
            for v, s in spec.cells():
                done[spec.run_id(v, s)] = run_cell(spec, v, s, parent)
    except BaseException:
        tracker.finish("FAILED")
        raise
    publish_status(spec, tracker)
    tracker.finish()
    report(spec, str(spec.records_dir() / "report"))
    return done


@flow(name="sweep-report", flow_run_name="report-{spec.name}")
def report(spec: SweepSpec, out: str, file: str | None = None) -> list[str]:
    """The sweep's report (flows/sweep_report.py) written to `out`, attached to this flow run as a markdown
    artifact and logged to the sweep's MLflow run where there is one; the files written."""
    import base64

    from prefect.artifacts import create_markdown_artifact

    from flows.sweep_report import build, write

    r = build(spec, file or f"<sweep {spec.name}>")
    files = write(r, Path(out))
    md = r.markdown
    for png in (f for f in files if f.suffix == ".png"):  # the artifact carries its pictures
        md = md.replace(f"({png.name})", f"(data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})")
    create_markdown_artifact(md, key=artifact_key("report", spec.name), description=f"sweep {spec.name}: report")
    id_file = sweep_folder(spec) / "mlflow_run_id"
    if id_file.exists():
        from mlflow.tracking import MlflowClient

        from infra.tracking import BusyRetry, default_tracking_uri

        cfg = spec.run_config(*spec.cells()[0])
        client = BusyRetry(MlflowClient(cfg.run.tracking_uri or default_tracking_uri(spec.runs_dir)))
        for f in files:
            client.log_artifact(id_file.read_text().strip(), str(f), "report")
    return [str(f) for f in files]


def ensure_limit(spec: SweepSpec) -> None:
    """The global concurrency limit `sweep-<name>` at `concurrency` slots (made or updated)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(f"sweep-{spec.name}", spec.concurrency)


def status_rows(spec: SweepSpec) -> list[dict]:
    """One row per (variant, seed): its run id, state, iterations trained of how many, and where its record is."""
    from flows.evaluate import last_iteration

    rows = []
    for v, s in spec.cells():
        rid = spec.run_id(v, s)
        run_dir = Path(spec.runs_dir) / rid
        csv, _ = record_paths(spec, v, s)
        total = spec.run_config(v, s).iterations
        trained = last_iteration(run_dir) if (run_dir / "config.yaml").exists() else 0
        if csv.exists():
            state = "recorded"
        elif not (run_dir / "config.yaml").exists():
            state = "pending"
        elif runs.is_locked(run_dir):
            state = "running"
        else:
            state = "interrupted"
        rows.append(
            {
                "variant": v,
                "seed": s,
                "run": rid,
                "state": state,
                "iterations": f"{trained}/{total}",
                "record": str(csv),
            }
        )
    return rows


def publish_status(spec: SweepSpec, tracker: Tracker) -> None:
    """The status table as a Prefect table artifact, and the records as the MLflow parent run's artifacts."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        status_rows(spec), key=artifact_key("sweep", spec.name), description=f"runs of sweep {spec.name}"
    )
    if spec.records_dir().is_dir():
        tracker.log_artifacts(spec.records_dir(), "records")
