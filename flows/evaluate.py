"""The evaluate flow: the team at a given policy iteration plays the held-out split greedily; or a team
with agents loaded back from the MLflow model registry (`teamrl eval --model models:/<name>@best`)."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from prefect import flow

from flows.report import partition_metrics
from infra import runs, store
from infra.policy import OPTIMIZER, latest_version
from infra.registry import resolve
from tasks import context
from tasks.coach_evaluate import coach_evaluate
from tasks.collect_rollouts import RolloutConfig, collect_rollouts


def evaluate_partition(run_dir: str, iteration: int) -> dict[str, float]:
    """Play (or reuse) partition iteration=K/phase=eval with the policies after K updates; its metrics."""
    agents = [a.name for a in context.pipeline(run_dir).agents]
    versions = store.agent_versions(run_dir, agents, iteration)
    collect_rollouts(run_dir, iteration, "eval", versions, split="eval", greedy=True)
    if context.section(run_dir, "rollout", RolloutConfig).eval_samples:
        collect_rollouts(run_dir, iteration, "eval", versions, split="eval", part="samples")
    coach_evaluate(run_dir, iteration, "eval")
    return partition_metrics(run_dir, iteration, "eval")


@flow(name="evaluate", flow_run_name="evaluate-{iteration}")
def evaluate(run_dir: str, iteration: int) -> dict[str, float]:
    """Held-out success (greedy) with a 95% bootstrap interval, pass@k, and per-agent statistics."""
    return evaluate_partition(run_dir, iteration)


def registered_team(runs_dir: str, models: list[str], tracking_uri: str, run_id: str | None = None) -> Path:
    """A new run folder `eval-<run>-<time>` for the team of run `run_id` (default: the run that registered the
    first model) with the given registered agents' checkpoints in place of the run's latest ones, all as
    version 0, so `evaluate(<folder>, 0)` plays it. The source run is not modified."""
    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for i, uri in enumerate(models):
            local, mv = resolve(uri, tracking_uri, Path(tmp) / str(i))
            agent = mv.tags["teamrl.agent"]
            if agent in got:
                raise ValueError(f"two --model options for agent {agent!r}: {got[agent][2]} and {uri}")
            got[agent] = (local, mv, uri)
        first = next(iter(got.values()))[1]
        source = runs.find_run(runs_dir, run_id) if run_id else Path(first.tags.get("teamrl.run_dir", ""))
        if not (source / "config.yaml").exists():
            raise FileNotFoundError(f"the run that registered {models[0]} ({source}) is not here: pass the id of a run "
                                    "whose team and base model it fits (teamrl eval RUN_ID --model ...)")
        cfg = runs.read_run_config(source)
        agents = [a.name for a in context.pipeline(str(source)).agents]
        for agent, (_, mv, uri) in got.items():
            if agent not in agents:
                raise ValueError(f"{uri} is agent {agent!r}; run {source.name}'s team is {agents}")
            want = (cfg["model"]["name"], cfg["model"]["weights"])
            have = (mv.tags.get("teamrl.model"), mv.tags.get("teamrl.weights"))
            if have != want:
                raise ValueError(f"{uri} was trained on model {have[0]} ({have[1]} weights); run {source.name} uses "
                                 f"{want[0]} ({want[1]}): pass a run with the same base model")
        new_id = f"eval-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}"[-100:].lstrip("-._")
        keep = {k: v for k, v in cfg.items() if k not in ("run_id", "nonce", "flow_run_id")}
        dst = runs.create_run(runs_dir, new_id, keep | {"run": keep["run"] | {"id": new_id}})
        (dst / "registered.json").write_text(json.dumps(
            {"source_run": str(source), **{a: {"uri": u, "name": mv.name, "version": mv.version}
                                            for a, (_, mv, u) in got.items()}}, indent=1))
        weights = shutil.ignore_patterns(OPTIMIZER)  # the team only plays: no update reads optimizer state here
        for agent in agents:
            target = dst / "checkpoints" / agent / "v0000"
            if agent in got:
                shutil.copytree(got[agent][0], target, ignore=weights)
            elif (v := latest_version(source, agent)) or (source / "checkpoints" / agent / "v0000").is_dir():
                shutil.copytree(source / "checkpoints" / agent / f"v{v:04d}", target, ignore=weights)
    return dst
