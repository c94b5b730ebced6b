"""The evaluate flow: the team at a given policy iteration plays the held-out split greedily."""
from __future__ import annotations

from prefect import flow

from flows.report import partition_metrics
from infra import store
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
