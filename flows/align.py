"""The align flow: Stage-0 alignment for a plug-and-play agent swap (TeamTR; docs/concepts/stage0.md).

In a run whose latest iteration K is finished, agent j is replaced by a new model: today `init=fresh`,
a new agent on the run's own base model (a fresh LoRA adapter, or a fresh copy of the base with
`model.weights=full`); another base model or model size is out of scope (see tasks/align.py). The flow

1. plays the held-out split greedily with the swapped team, without Stage-0: `eval-swap-<j>` at K;
2. aligns the new agent to the old one on the contexts of iteration K's rollouts (`stage0_align`):
   checkpoint version v+1 of j (meta `stage0: true`, `latest` moved) and an `updates` row (phase
   `align`, strategy `stage0`), which makes v+1 agent j's version after iteration K;
3. plays the held-out split with the aligned team: `eval-aligned-<j>` at K;
4. records one `align` row, MLflow metrics (`stage0_*/<j>`, `eval-swap-<j>/*`, `eval-aligned-<j>/*`,
   step K) and the swap shock relative to the team before the swap (its `eval` partition at K, used
   when it exists and was played by that team; never redone).

Rerunning it finishes an interrupted alignment; finished steps are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.metrics import partition_metrics
from infra import runs, store
from infra.errors import TeamrlError
from infra.tracking import Tracker
from tasks.align import (
    AlignConfig,
    checkpoint_meta,
    latest_rollout_iteration,
    probe_set,
    record_alignment,
    stage0_align,
)
from tasks.coach_evaluate import coach_evaluate
from tasks.collect_rollouts import collect_rollouts
from tasks.context import RunContext


class AlignError(TeamrlError, ValueError):
    """A run, an agent or options that cannot be aligned; the message says why."""


@dataclass
class Plan:
    iteration: int  # K: the latest finished iteration; its rollouts are the probe set
    team: dict[str, int]  # the team's versions before the swap
    version_after: int  # the aligned agent's new version


def plan(ctx: RunContext, cfg: AlignConfig) -> Plan:
    """Check that `cfg.agent` of the run can be swapped and aligned now; the versions involved."""
    run_dir = ctx.run_dir
    name, agent = Path(run_dir).name, cfg.agent
    agents = [a.name for a in ctx.pipeline.agents]
    if agent not in agents:
        raise AlignError(f"unknown agent {agent!r}; the team of run {name!r} is {', '.join(agents)}")
    unit = ctx.weights[agent]
    if (shared := ctx.roles_of(unit)) != [agent]:
        others = ", ".join(r for r in shared if r != agent)
        raise AlignError(
            f"{agent} of run {name!r} shares its weights {unit!r} with {others}: "
            "swapping one role of a shared model would swap them all; Stage-0 aligns an agent "
            "with weights of its own (e.g. pipeline.shared_model=false)"
        )
    k = latest_rollout_iteration(run_dir)
    if k is None:
        raise AlignError(
            f"run {name!r} has no training rollouts yet: the probe set is the contexts the team "
            f"produced at {agent}'s turns, so train at least one iteration first"
        )
    up = store.read_table(run_dir, "updates", k)
    missing = sorted(set(agents) - set(up.loc[up["strategy"] != "stage0", "agent"]))
    if missing:
        raise AlignError(
            f"iteration {k} of run {name!r} is unfinished ({', '.join(missing)} not updated yet): "
            f"finish it with `teamrl train PRESET --resume {name}` first"
        )
    if not probe_set(ctx, k, agent, cfg.probe_size):
        raise AlignError(f"{agent} has no actions with a response in iteration {k}'s rollouts: no probe set")
    team = store.agent_versions(run_dir, agents, k)
    done = up[(up["phase"] == "align") & (up["agent"] == agent)]
    if len(done):  # aligned before: this run finishes or repeats that alignment
        team[agent] = int(done["version_before"].iloc[0])
        earlier = checkpoint_meta(run_dir, agent, int(done["version_after"].iloc[0]))["options"]
        changed = [f"{o}={earlier[o]!r} (now {v!r})" for o, v in cfg.model_dump(mode="json").items() if earlier[o] != v]
        if changed:
            raise AlignError(
                f"{agent} of run {name!r} was already aligned at iteration {k} with other options: "
                f"{', '.join(changed)}; train further before swapping it again"
            )
    return Plan(k, team, team[agent] + 1)


def evaluate_team(run: RunContext, iteration: int, phase: str, versions: dict[str, int]) -> dict[str, float]:
    """Play (or reuse) held-out partition iteration/phase greedily with `versions`; its metrics."""
    collect_rollouts(run, iteration, phase, versions, split="eval", greedy=True)
    coach_evaluate(run, iteration, phase)
    return partition_metrics(run.run_dir, iteration, phase)


def before_swap(run_dir: str, iteration: int, team: dict[str, int]) -> dict[str, float] | None:
    """Metrics of the `eval` partition at `iteration` when the team before the swap played it, else None."""
    if not store.partition_exists(run_dir, "episodes", iteration, "eval"):
        return None
    played = dict(store.read_table(run_dir, "episodes", iteration, "eval")["policy_versions"].iloc[0])
    return partition_metrics(run_dir, iteration, "eval") if played == team else None


def _flow_run_name() -> str:
    p = flow_run.parameters
    agent = p["config"].agent if isinstance(p["config"], AlignConfig) else p["config"]["agent"]
    return f"align-{agent}-{Path(p['run_dir']).name}"


@flow(name="align", flow_run_name=_flow_run_name, log_prints=True)
def align(run_dir: str, config: AlignConfig) -> dict:
    """Swap `config.agent` for a new model and align it (Stage-0) before training continues. Returns the
    KL before/after, the steps, and held-out metrics before the swap (None when not evaluated), after the
    swap and after the alignment."""
    logger = get_run_logger()
    run_dir, agent = str(run_dir), config.agent
    with runs.run_lock(run_dir):
        runs.remove_temporaries(run_dir)  # what an interrupted writer left half-written
        # the engines are released once the team has played; the run's identity and config stay readable
        with RunContext(run_dir) as run:
            p = plan(run, config)
            k = p.iteration
            swap_phase, aligned_phase = f"eval-swap-{agent}", f"eval-aligned-{agent}"
            swapped = evaluate_team(run, k, swap_phase, p.team | {agent: 0})
            meta = stage0_align(run, k, p.team[agent], config)
            aligned = evaluate_team(run, k, aligned_phase, p.team | {agent: p.version_after})
        before = before_swap(run_dir, k, p.team)
        row = {
            "run_id": run.run_id,
            "iteration": k,
            "phase": "align",
            "agent": agent,
            "init": config.init,
            "version_before": p.team[agent],
            "version_after": p.version_after,
            "delta0": config.delta0,
            "success_before": None if before is None else before["success_rate"],
            "success_swap": swapped["success_rate"],
            "success_aligned": aligned["success_rate"],
        }
        row |= {
            c: meta[c]
            for c in ("probe_actions", "probe_tokens", "lr", "kl_before", "kl_after", "steps", "converged", "seconds")
        }
        record_alignment(run, k, agent, row)
        settings = run.config.run
        tracker = Tracker(
            run_dir,
            Path(run_dir).parent,
            settings.experiment,
            settings.tracking_uri,
            runs.read_run_config(run_dir),
            enabled=settings.mlflow,
        )
        metrics = {f"stage0_{c}/{agent}": meta[c] for c in ("kl_before", "kl_after", "steps")}
        metrics |= {f"{swap_phase}/{m}": v for m, v in swapped.items()}
        metrics |= {f"{aligned_phase}/{m}": v for m, v in aligned.items()}
        tracker.log_metrics(metrics, step=k)
        tracker.finish()
    logger.info(
        "stage-0 %s at iteration %d: KL %.4g -> %.4g in %d steps; held-out success %s -> swap %.3f -> aligned %.3f",
        agent,
        k,
        meta["kl_before"],
        meta["kl_after"],
        meta["steps"],
        "-" if before is None else f"{before['success_rate']:.3f}",
        swapped["success_rate"],
        aligned["success_rate"],
    )
    return {
        "run_dir": run_dir,
        "iteration": k,
        "agent": agent,
        "team": p.team,
        "version_after": p.version_after,
        "delta0": config.delta0,
        **{c: meta[c] for c in ("kl_before", "kl_after", "steps", "converged", "probe_actions", "probe_tokens")},
        "eval": {"eval": before, swap_phase: swapped, aligned_phase: aligned},
    }
