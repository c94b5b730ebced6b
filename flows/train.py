"""The train flow: per iteration, collect_rollouts -> extract -> coach_evaluate -> compute_advantages
-> update (one per agent), with held-out evaluation before the first and after the last iteration."""
from __future__ import annotations

import base64
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.config import RunConfig, validate
from flows.evaluate import evaluate_partition
from flows.report import partition_metrics, plot_run, summary_markdown, update_metrics
from infra import runs, store
from infra.tracking import Tracker
from tasks import context
from tasks.coach_evaluate import coach_evaluate
from tasks.collect_rollouts import collect_rollouts
from tasks.compute_advantages import compute_advantages
from tasks.extract import extract
from tasks.update import update


def prepare_run(config: RunConfig, resume: str | None = None) -> Path:
    """Create the run folder for `config`, or reopen run `resume` (its saved config wins)."""
    root = Path(config.run.dir)
    if resume:
        return runs.find_run(root, resume)
    run_id = config.run.id or runs.new_run_id(config.preset)
    cfg = config.model_copy(update={"run": config.run.model_copy(update={"id": run_id})})
    return runs.create_run(root, run_id, cfg.model_dump(mode="json"))


def saved_config(run_dir: Path) -> RunConfig:
    raw = runs.read_run_config(run_dir)
    return validate({k: v for k, v in raw.items() if k not in ("run_id", "nonce")})


def update_phase(strategy: str, agent_index: int) -> str:
    """The resample hook: which rollout partition agent i's update learns from.

    `joint` updates every agent from the iteration's one rollout set; TeamTR will collect a
    `resample-<i>` partition with the partially updated team here before agent i's update.
    """
    if strategy == "joint":
        return "rollout"
    raise ValueError(f"unknown strategy {strategy!r}")


def run_iteration(run_dir: str, k: int, agents: list[str], strategy: str) -> dict[str, float]:
    """One iteration of the DAG; returns its metrics (stage seconds included)."""
    seconds: dict[str, float] = {}

    def timed(name, fn, *args, **kw):
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
        return out

    versions = store.agent_versions(run_dir, agents, k - 1)
    path = timed("collect_rollouts", collect_rollouts, run_dir, k, "rollout", versions)
    timed("extract", extract, run_dir, k, "rollout", path)
    timed("coach_evaluate", coach_evaluate, run_dir, k, "rollout")
    timed("compute_advantages", compute_advantages, run_dir, k, "rollout")
    for i, agent in enumerate(agents):
        timed("update", update.with_options(task_run_name=f"update-{agent}"), run_dir, k,
              update_phase(strategy, i), agent, versions[agent])
    m = partition_metrics(run_dir, k, "rollout") | update_metrics(run_dir, k)
    acts = store.read_table(run_dir, "actions", k, "rollout")
    tokens = float(acts["response_ids"].map(len).sum())
    m["rollout_tokens_per_s"] = tokens / max(seconds["collect_rollouts"], 1e-9)
    m |= {f"seconds/{s}": v for s, v in seconds.items()}
    return m


def publish_summary(run_dir: Path, tracker: Tracker) -> None:
    """summary.png + summary.md in the run folder, logged to MLflow and attached to the flow run."""
    from prefect.artifacts import create_markdown_artifact

    png = plot_run(run_dir)
    md = summary_markdown(run_dir)
    (run_dir / "summary.md").write_text(md + f"\n\n![summary]({png.name})\n")
    tracker.log_artifact(png, "summary")
    tracker.log_artifact(run_dir / "summary.md", "summary")
    b64 = base64.b64encode(png.read_bytes()).decode()
    create_markdown_artifact(key=f"summary-{run_dir.name.lower().replace('_', '-').replace('.', '-')}"[:100],
                             markdown=md + f"\n\n![summary](data:image/png;base64,{b64})\n\nPlot file: `{png}`",
                             description="held-out success before/after training and coach score per agent")


def _flow_run_name() -> str:
    """train-<pipeline>-<run id> (the resumed run's id, the configured one, or `new`)."""
    p = flow_run.parameters
    cfg = p["config"] if isinstance(p["config"], RunConfig) else RunConfig.model_validate(p["config"])
    return f"train-{cfg.pipeline.name}-{p.get('resume') or cfg.run.id or 'new'}"


@flow(name="train", flow_run_name=_flow_run_name, log_prints=True)
def train(config: RunConfig, resume: str | None = None) -> str:
    """Train a team. `resume`: the id of a run to finish (finished stages are not redone)."""
    logger = get_run_logger()
    run_dir = prepare_run(config, resume)
    cfg = saved_config(run_dir)
    with runs.run_lock(run_dir):
        if resume and (n := runs.remove_temporaries(run_dir)):
            logger.info("removed %d half-written temporary file(s) left by the interrupted run", n)
        rd = str(run_dir)
        agents = [a.name for a in context.pipeline(rd).agents]
        policy = context.policy(rd)
        for a in agents:  # version 0 on disk makes every later load (and a resume) exact
            if not (run_dir / "checkpoints" / a / "v0000").exists():
                policy.load(rd, a, 0)  # the initial weights
                policy.save(rd, a, 0)
        tracker = Tracker(run_dir, cfg.run.dir, cfg.run.experiment, cfg.run.tracking_uri,
                          cfg.model_dump(mode="json"), enabled=cfg.run.mlflow)
        try:
            if cfg.evaluate:
                tracker.log_metrics({f"eval/{k}": v for k, v in evaluate_partition(rd, 0).items()}, step=0)
            for k in range(1, cfg.iterations + 1):
                m = run_iteration(rd, k, agents, cfg.algorithm.strategy)
                tracker.log_metrics(m, step=k)
                logger.info("iteration %d: success %.3f, %s", k, m.get("success_rate", float("nan")),
                            ", ".join(f"{a} coach {m.get(f'coach_score/{a}', float('nan')):.2f}" for a in agents))
            if cfg.evaluate and cfg.iterations > 0:
                tracker.log_metrics({f"eval/{k}": v for k, v in evaluate_partition(rd, cfg.iterations).items()},
                                    step=cfg.iterations)
            tracker.log_artifacts(run_dir / "checkpoints", "checkpoints")
            publish_summary(run_dir, tracker)
        except BaseException:
            tracker.finish("FAILED")
            raise
        tracker.finish()
    return rd
