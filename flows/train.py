"""The train flow: per iteration, collect_rollouts (with MARS's System-1 `extract` per turn) ->
coach_evaluate -> compute_advantages -> update (one per weights unit: an agent's own weights, or the
model several roles share; TeamTR resamples before each later unit's update), with held-out evaluation
before the first and after the last iteration. Versions are per unit; a role plays at its unit's."""

from __future__ import annotations

import base64
import re
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger
from prefect.context import SettingsContext, get_settings_context
from prefect.runtime import flow_run
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

from flows.evaluate import evaluate_partition
from flows.metrics import agent_table, is_eval, partition_metrics, update_metrics
from flows.report import plot_run, summary_markdown
from infra import engines, flow_runs, runs, store
from infra.interrupt import by_ctrl_c
from infra.policy import OPTIMIZER, checkpoint_dir, latest_version, prune_checkpoints
from infra.registry import registered_checkpoints
from infra.tracking import Tracker
from pipelines.base import role_versions
from tasks import context
from tasks.algorithm import AlgorithmConfig
from tasks.coach_bias import by_task_type, diverging
from tasks.coach_evaluate import coach_evaluate
from tasks.collect_rollouts import collect_rollouts
from tasks.compute_advantages import compute_advantages
from tasks.config import RunConfig
from tasks.context import RunContext
from tasks.update import update


def prepare_run(config: RunConfig, resume: str | None = None) -> tuple[Path, bool]:
    """(run folder, reopened): create the folder for `config`, or reopen run `resume` or the run this
    flow run created before (`prefect flow-run retry`); a reopened run's saved config wins."""
    root = Path(config.run.dir)
    if resume:
        return runs.find_run(root, resume), True
    if flow_run.id and (earlier := runs.find_by_flow_run(root, flow_run.id)):
        return earlier, True
    run_id = config.run.id or runs.new_run_id(config.preset)
    cfg = config.model_copy(update={"run": config.run.model_copy(update={"id": run_id})})
    return runs.create_run(root, run_id, cfg.model_dump(mode="json"), flow_run_id=flow_run.id), False


def update_phase(strategy: str, position: int) -> str:
    """The resample hook: which rollout partition the agent updated at `position` (0-based) learns from.

    `joint` and `stale` train every agent on the iteration's one rollout set; `teamtr` trains the
    first on it (still on-policy) and each later one on `resample-<position>`, collected with the
    agents before it already updated.
    """
    if strategy in ("joint", "stale") or position == 0:
        return "rollout"
    if strategy == "teamtr":
        return f"resample-{position}"
    raise ValueError(f"unknown strategy {strategy!r}")


def update_order(agents: list[str], order: str, seed: int, iteration: int) -> list[str]:
    """The team's order, or a permutation seeded by (run seed, iteration) so a resume replays it."""
    if order == "fixed":
        return list(agents)
    rng = np.random.default_rng(context.stage_seed(seed, "order", iteration))
    return [agents[i] for i in rng.permutation(len(agents))]


def timed(seconds: dict[str, float], name: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), adding its wall time to seconds[name]."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
    return out


def rollout_partition(run: RunContext, k: int, phase: str, versions: dict[str, int], seconds: dict, **kw) -> None:
    """collect_rollouts (a pipeline's own stages, such as MARS's `extract`, run inside) -> coach_evaluate ->
    compute_advantages."""
    timed(seconds, "collect_rollouts", collect_rollouts, run, k, phase, versions, **kw)
    timed(seconds, "coach_evaluate", coach_evaluate, run, k, phase)
    timed(seconds, "compute_advantages", compute_advantages, run, k, phase)


def iteration_stages(run: RunContext, k: int, agents: list[str], algo: AlgorithmConfig, seed: int) -> dict[str, float]:
    """One iteration of the DAG over the team's weights units `agents`; returns its metrics (stage seconds
    included)."""
    seconds: dict[str, float] = {}
    run_dir, roles = run.run_dir, run.weights
    versions = store.agent_versions(run_dir, agents, k - 1)
    rollout_partition(run, k, "rollout", role_versions(roles, versions), seconds)
    current = dict(versions)  # the partially updated team
    for i, agent in enumerate(update_order(agents, algo.order, seed, k)):
        phase = update_phase(algo.strategy, i)
        if phase != "rollout":
            rollout_partition(run, k, phase, role_versions(roles, current), seconds, questions=algo.resample_questions)
        v = timed(seconds, "update", update, run, k, phase, agent, versions[agent])
        if algo.strategy != "joint":
            current[agent] = v
    m = partition_metrics(run_dir, k, "rollout") | update_metrics(run_dir, k)

    def training(table):  # this iteration's rollout and resample partitions (not its evaluation)
        df = store.read_table(run_dir, table, k)
        return df[(df["phase"] == "rollout") | df["phase"].str.startswith("resample")]

    tokens = training("actions").groupby("phase")["response_ids"].agg(lambda c: float(c.map(len).sum()))
    m["rollout_tokens_per_s"] = tokens.sum() / max(seconds.get("collect_rollouts", 0.0), 1e-9)
    # TeamTR's price: rollouts and tokens spent on resamples, relative to the stage-start set (`stale`'s cost)
    eps = training("episodes").groupby("phase").size()
    m["resample/extra_episodes_frac"] = float(eps.drop("rollout").sum() / eps["rollout"])
    m["resample/extra_tokens_frac"] = float(tokens.drop("rollout").sum() / tokens["rollout"])
    m |= {f"seconds/{s}": v for s, v in seconds.items()}
    return m


@flow(name="iteration", flow_run_name="iteration-{k}")
def iteration_flow(run: RunContext, k: int, agents: list[str], algo: AlgorithmConfig, seed: int) -> dict[str, float]:
    """One iteration of the DAG as a sub-flow run `iteration-<k>`."""
    return iteration_stages(run, k, agents, algo, seed)


_no_heartbeat: list = []  # [(the settings in force, the same with the heartbeat off)]: the last pair made


@contextmanager
def no_heartbeat():
    """Prefect's settings in force with the flow-run heartbeat off. Made once per settings object:
    `temporary_settings` rebuilds every setting from the environment on each entry (26 ms here, a
    fifth of the sub-flow run it wraps)."""
    ctx = get_settings_context()
    if not _no_heartbeat or _no_heartbeat[0][0] is not ctx.settings:
        _no_heartbeat[:] = [
            (ctx.settings, ctx.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        ]
    with SettingsContext(profile=ctx.profile, settings=_no_heartbeat[0][1]):
        yield


def train_iteration(run: RunContext, k: int, agents: list[str], cfg: RunConfig, tracker: Tracker) -> dict[str, float]:
    """Iteration k of the team's weights units `agents` as `train` runs it: the sub-flow, the coach-bias
    monitor, MLflow, the table artifact and the checkpoint pruning.

    The sub-flow runs without Prefect's flow-run heartbeat: `train`'s own heartbeat covers it, and the
    engine joins the heartbeat thread, which sleeps in 1 s steps, on exit (about 0.5 s per iteration)."""
    rd, run_dir = run.run_dir, Path(run.run_dir)
    with no_heartbeat():
        m = iteration_flow(run, k, agents, cfg.algorithm, cfg.seed)
    if types := run.pipeline.task_types:  # the coach-bias monitor
        m |= coach_bias_metrics(rd, k, *types)
    tracker.log_metrics(m, step=k)
    traced = trace_partitions(run_dir, k, cfg, tracker, training=True)
    roles_and_units = list(dict.fromkeys([*run.weights, *agents]))
    publish_iteration(run_dir, k, m, roles_and_units, tracker.traces_link() if traced else None)
    prune_after_iteration(run_dir, k, agents, cfg.checkpoint.keep_every, tracker)
    return m


def prune_after_iteration(run_dir: Path, k: int, agents: list[str], keep_every: int, tracker: Tracker) -> None:
    """Once iteration k's updates are all recorded, delete the checkpoint files no later stage or resume reads:
    each agent's optimizer state but where its next update starts and where iteration k's started (so that
    iteration k can be redone after its damaged `updates` partition is deleted), and weights per
    `checkpoint.keep_every`."""
    registered = registered_checkpoints(tracker.client, tracker.run_id) if tracker.enabled else {}
    started = store.agent_versions(run_dir, agents, k - 1)
    for a, v in store.agent_versions(run_dir, agents, k).items():
        prune_checkpoints(run_dir, a, keep_every, registered.get(a, set()), resume={v, started[a]})


def coach_bias_metrics(run_dir: str, k: int, type_key: str, names: dict[float, str]) -> dict[str, float]:
    """`coach_bias/<type>/{coach,metric,diverging}` for iteration k's rollouts; a diverging type also gets
    a warning in the log and a Prefect markdown artifact."""
    from prefect.artifacts import create_markdown_artifact

    def table(it):
        return by_task_type(
            store.read_table(run_dir, "episodes", it, "rollout"), store.load_actions(run_dir, it, "rollout"), type_key
        )

    cur = table(k)
    prev = table(k - 1) if k > 1 else cur.iloc[0:0]
    m: dict[str, float] = {}
    for kind, row in cur.iterrows():
        name = names.get(kind, str(kind))
        flag = kind in prev.index and diverging(
            prev.at[kind, "coach"], row["coach"], prev.at[kind, "metric"], row["metric"]
        )
        m |= {
            f"coach_bias/{name}/coach": row["coach"],
            f"coach_bias/{name}/metric": row["metric"],
            f"coach_bias/{name}/diverging": float(flag),
        }
        if flag:
            msg = (
                f"iteration {k}, {name} tasks: the coach's mean score rose from {prev.at[kind, 'coach']:.2f} to "
                f"{row['coach']:.2f} (of 1) while the metric went from {prev.at[kind, 'metric']:.2f} to "
                f"{row['metric']:.2f}: the agents may be exploiting a coach bias"
            )
            get_run_logger().warning(msg)
            key = f"coach-bias-{k}-{name}".replace("_", "-")  # artifact keys: lowercase letters, digits, dashes
            create_markdown_artifact(f"## Coach-bias warning\n\n{msg}.\n", key=key)
    return m


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes only, at most 100 characters)."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")[:100]


def trace_partitions(run_dir: Path, k: int, cfg: RunConfig, tracker: Tracker, training: bool) -> int:
    """Iteration k's training partitions (`training`) or its held-out ones as MLflow traces, as `run.traces`
    chooses (infra/traces.py), after their stages ended; how many episodes were chosen. The tracker's writer
    thread writes them while the next stages run, and the run's end waits for it."""
    phases = sorted(p.name.split("=", 1)[1] for p in (run_dir / "episodes" / f"iteration={k}").glob("phase=*"))
    chosen = [p for p in phases if is_eval(p) != training]
    seed = context.stage_seed(cfg.seed, "traces", k)
    return sum(tracker.log_traces(run_dir, k, p, cfg.run.traces, cfg.run.trace_sample, seed) for p in chosen)


def publish_iteration(run_dir: Path, k: int, m: dict[str, float], agents: list[str], traces: str | None) -> None:
    """Iteration k's per-agent metrics as a Prefect table artifact (one version per iteration), with the link
    to the episodes traced in MLflow."""
    from prefect.artifacts import create_table_artifact

    where = f"; its episodes as MLflow traces: {traces} (tags.teamrl.iteration = '{k}')" if traces else ""
    create_table_artifact(
        agent_table(m, agents),
        key=artifact_key(run_dir.name, "agents"),
        description=f"iteration {k}: success {m.get('success_rate', float('nan')):.3f}; "
        f"per-agent coach score, reward, loss, KL, certificate{where}",
    )


def publish_registry(cfg: RunConfig, run_dir: Path, tracker: Tracker, agents: list[str], final: dict) -> None:
    """Register every weights unit's final checkpoint in MLflow (`best` follows held-out success), then link the
    MLflow run from the Prefect flow run."""
    from prefect.artifacts import create_link_artifact

    versions = {a: latest_version(run_dir, a) for a in agents}
    tags = {
        "teamrl.run_id": run_dir.name,
        "teamrl.pipeline": cfg.pipeline.name,
        "teamrl.model": cfg.model.name,
        "teamrl.weights": cfg.model.weights,
        "teamrl.iteration": str(cfg.iterations),
    }
    for r in tracker.register(cfg.run.registry or cfg.preset, versions, tags, final.get("success_rate")):
        get_run_logger().info("registered models:/%s/%s%s", r.name, r.version, " (now @best)" if r.best else "")
    if tracker.enabled:
        create_link_artifact(
            tracker.ui_link(),
            link_text=f"MLflow run {tracker.run_id}",
            key=artifact_key(run_dir.name, "mlflow"),
            description="metrics, parameters, checkpoints and the summary plot of this run",
        )


def publish_summary(run_dir: Path, tracker: Tracker) -> None:
    """summary.png + summary.md in the run folder, logged to MLflow and attached to the flow run."""
    from prefect.artifacts import create_markdown_artifact

    png = plot_run(run_dir)
    md = summary_markdown(run_dir)
    (run_dir / "summary.md").write_text(md + f"\n\n![summary]({png.name})\n")
    tracker.log_artifact(png, "summary")
    tracker.log_artifact(run_dir / "summary.md", "summary")
    b64 = base64.b64encode(png.read_bytes()).decode()
    create_markdown_artifact(
        key=artifact_key("summary", run_dir.name),
        markdown=md + f"\n\n![summary](data:image/png;base64,{b64})\n\nPlot file: `{png}`",
        description="held-out success before/after training and coach score per agent",
    )


def _flow_run_name() -> str:
    """train-<pipeline>-<run id> (the resumed run's id, the configured one, or `new` until it is created)."""
    p = flow_run.parameters
    cfg = p["config"] if isinstance(p["config"], RunConfig) else RunConfig.model_validate(p["config"])
    return f"train-{cfg.pipeline.name}-{p.get('resume') or cfg.run.id or 'new'}"


def _name_flow_run(pipeline: str, run_dir: Path) -> None:
    """Rename this flow run `train-<pipeline>-<run id>` once a generated run id is known."""
    from prefect.client.orchestration import get_client

    name = f"train-{pipeline}-{run_dir.name}"
    if flow_run.id and flow_run.name != name:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)


def crash_orphans(run_dir: Path) -> None:
    """Mark Crashed the flow runs that killed processes left unfinished on this run (infra/flow_runs.py)."""
    msg = f"its process was killed; marked Crashed by flow run {flow_run.id}, which reopened run {run_dir.name}"
    if marked := flow_runs.crash_orphans(run_dir, flow_run.id, msg):
        get_run_logger().warning(
            "marked Crashed the flow run(s) %s, left unfinished by a killed process", ", ".join(marked)
        )


@flow(name="train", flow_run_name=_flow_run_name, log_prints=True)
def train(config: RunConfig, resume: str | None = None, iterations: int | None = None) -> str:
    """Train a team. `resume`: the id of a run to finish (finished stages are not redone);
    `iterations` with `resume`: train the run on to this many iterations (never fewer than saved)."""
    if not resume:  # before a folder is made for a run that cannot start here
        engines.check(config.engines)
    run_dir, reopened = prepare_run(config, resume)
    _name_flow_run(config.pipeline.name, run_dir)
    with runs.run_lock(run_dir):
        if flow_run.id:
            if reopened:
                crash_orphans(run_dir)
            flow_runs.record(run_dir, flow_run.id)
        if reopened and iterations is not None:
            runs.extend_run(run_dir, iterations)
        with RunContext(run_dir) as run:
            train_opened(run, reopened)
    return str(run_dir)


def train_opened(run: RunContext, reopened: bool) -> None:
    """The train flow's work on its opened, locked run: initial weights, MLflow, the evaluations and iterations,
    the registry and the summary; MLflow's run ends KILLED on Ctrl-C, FAILED on an error."""
    logger = get_run_logger()
    cfg, run_dir, rd = run.config, Path(run.run_dir), run.run_dir
    if reopened:
        engines.check(cfg.engines)
    if reopened and (n := runs.remove_temporaries(run_dir)):
        logger.info("removed %d half-written temporary file(s) left by the interrupted run", n)
    agents = run.units  # the weights units: what is updated, checkpointed and registered
    policy = run.policy
    for a in agents:  # version 0 on disk makes every later load (and a resume) exact
        if not checkpoint_dir(run_dir, a, 0).exists():
            policy.load(rd, a, 0)  # the initial weights
            policy.save(rd, a, 0)
    tracker = Tracker(
        run_dir,
        cfg.run.dir,
        cfg.run.experiment,
        cfg.run.tracking_uri,
        cfg.model_dump(mode="json"),
        enabled=cfg.run.mlflow,
        parent=cfg.run.mlflow_parent,
    )
    try:
        final: dict[str, float] = {}  # the latest held-out metrics
        if cfg.evaluate:
            final = evaluate_partition(run, 0)
            tracker.log_metrics({f"eval/{k}": v for k, v in final.items()}, step=0)
            trace_partitions(run_dir, 0, cfg, tracker, training=False)
        for k in range(1, cfg.iterations + 1):
            m = train_iteration(run, k, agents, cfg, tracker)
            logger.info(
                "iteration %d: success %.3f, %s",
                k,
                m.get("success_rate", float("nan")),
                ", ".join(f"{a} coach {m.get(f'coach_score/{a}', float('nan')):.2f}" for a in run.weights),
            )
            if cfg.evaluate and (k == cfg.iterations or (cfg.eval_every and k % cfg.eval_every == 0)):
                final = evaluate_partition(run, k)
                tracker.log_metrics({f"eval/{n}": v for n, v in final.items()}, step=k)
                trace_partitions(run_dir, k, cfg, tracker, training=False)
        # the weights, not the optimizer state: a registered model never resumes training from MLflow
        tracker.log_artifacts(run_dir / "checkpoints", "checkpoints", exclude=frozenset({OPTIMIZER}))
        publish_registry(cfg, run_dir, tracker, agents, final)
        publish_summary(run_dir, tracker)
    except BaseException as e:
        tracker.finish("KILLED" if by_ctrl_c(e) else "FAILED")
        if by_ctrl_c(e) and not isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from e  # so that Prefect records the flow run Crashed, as for any Ctrl-C
        raise
    tracker.finish()
