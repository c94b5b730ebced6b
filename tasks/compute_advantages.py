"""DAG stage `compute_advantages`: per-token advantages and loss masks; the `advantages` partition."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task

from infra import store
from infra.faults import crash_point
from tasks import context
from tasks.advantages import Sample, blend_score, estimate
from tasks.algorithm import AlgorithmConfig


def advantage_rows(run_dir: str, iteration: int, phase: str) -> list[dict]:
    cfg = context.section(run_dir, "algorithm", AlgorithmConfig)
    df = store.load_actions(run_dir, iteration, phase)
    eps = store.read_table(run_dir, "episodes", iteration, phase).set_index("episode_id")
    outcome, group = eps["outcome"].to_dict(), eps["group_id"].to_dict()
    records = df.to_dict("records")
    rows = []
    for agent in sorted({r["agent"] for r in records}):
        recs = [r for r in records if r["agent"] == agent]
        samples = []
        for r in recs:
            coach = r["score"]
            ok = coach is not None and not (isinstance(coach, float) and np.isnan(coach))
            s = blend_score(coach, outcome[r["episode_id"]], cfg.outcome_weight) if ok else None
            samples.append(Sample(r["episode_id"], group[r["episode_id"]], agent, int(r["turn"]),
                                  np.asarray(r["logprobs"], np.float64), np.asarray(r["ref_logprobs"], np.float64), s))
        # Normalised over this agent's whole update batch (REINFORCE++), per group (GRPO / RLOO).
        advs = estimate(cfg.estimator, samples, beta=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
                        return_scope=cfg.return_scope, eps=cfg.whiten_eps)
        for r, smp, a in zip(recs, samples, advs):
            n = len(r["response_ids"])
            rows.append({k: r[k] for k in store.KEYS} | {
                "iteration": iteration, "phase": phase, "reward": smp.score,
                "advantages": (a if a is not None else np.zeros(n)).astype(np.float32).tolist(),
                "loss_mask": [1 if a is not None else 0] * n, "weight": 1 if a is not None else 0})
    return rows


def _key(ctx, params) -> str:
    done = store.partition_exists(params["run_dir"], "advantages", params["iteration"], params["phase"], name="all")
    return context.prefect_cache_key(params["run_dir"], done, params["iteration"], params["phase"], "compute_advantages")


@task(name="compute_advantages", cache_key_fn=_key, persist_result=True)
def compute_advantages(run_dir: str, iteration: int, phase: str) -> str:
    if not store.partition_exists(run_dir, "advantages", iteration, phase, name="all"):
        rows = advantage_rows(run_dir, iteration, phase)
        crash_point("compute_advantages")
        store.write_partition(run_dir, "advantages", iteration, phase, rows, name="all")
    return str(Path(run_dir) / "advantages" / f"iteration={iteration}" / f"phase={phase}")
