"""DAG stage `compute_advantages`: per-token advantages and loss masks; the `advantages` partition.

For stale / teamtr, `algorithm.certify_holdout` of the batch's question groups are held out: their rows
keep their reward but no advantage or weight (`held_out`), so that the update's certificate
(tasks/certificate.py) is estimated on episodes the update never fitted."""

from __future__ import annotations

from functools import partial

import numpy as np

from infra import store
from pipelines.base import CreditBatch
from tasks.advantages import ESTIMATORS, Sample, blend_score, estimate
from tasks.certificate import holdout_groups
from tasks.context import RunContext
from tasks.stage import stage


def advantage_rows(ctx: RunContext, iteration: int, phase: str) -> list[dict]:
    cfg = ctx.config.algorithm
    df = store.load_actions(ctx.run_dir, iteration, phase)
    eps = store.read_table(ctx.run_dir, "episodes", iteration, phase).set_index("episode_id")
    outcome, group = eps["outcome"].to_dict(), eps["group_id"].to_dict()
    trajectory = ESTIMATORS.traits(cfg.estimator).trajectory
    # stale / teamtr: whole question groups kept out of the update (and of every normalisation) for the certificate
    share = cfg.certify_holdout if cfg.strategy != "joint" else 0.0
    rng = np.random.default_rng(ctx.seed_for("certify", iteration, phase))
    held = holdout_groups([str(group[e]) for e in df["episode_id"]], share, rng)
    records = [r for r in df.to_dict("records") if str(group[r["episode_id"]]) not in held]
    # REINFORCE++ normalises over one agent's samples (an agent sharing a model with others too: their scores
    # may differ in scale), GRPO / RLOO per group within them; a
    # trajectory estimator sees every agent's samples at once, scored with the episode's reward.
    batches = (
        [records]
        if trajectory
        else [[r for r in records if r["agent"] == a] for a in sorted({r["agent"] for r in records})]
    )
    rows, acts = [], []  # acts[i]: the action of rows[i], for the pipeline's weighing
    for recs in batches:
        samples = []
        for r in recs:
            ref = None if r["ref_logprobs"] is None else np.asarray(r["ref_logprobs"], np.float64)
            samples.append(
                Sample(
                    r["episode_id"],
                    group[r["episode_id"]],
                    r["agent"],
                    int(r["turn"]),
                    np.asarray(r["logprobs"], np.float64),
                    ref,
                    reward_of(r, outcome[r["episode_id"]], trajectory, cfg.outcome_weight),
                )
            )
        kwargs = dict(
            beta=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            return_scope=cfg.return_scope,
            eps=cfg.whiten_eps,
            min_std=cfg.whiten_min_std,
        )
        advs = estimate(cfg.estimator, samples, **kwargs)
        raws = estimate(cfg.estimator, samples, scale=False, **kwargs)  # in reward units: raw_advantages
        ctx.pipeline.credit(CreditBatch(recs, samples, advs, raws, trajectory, partial(estimate, eps=cfg.whiten_eps)))
        if cfg.positive_only:
            advs = positive_part(advs)
        for r, smp, a, raw in zip(recs, samples, advs, raws):
            rows.append(advantage_row(r, iteration, phase, smp.score, a, raw))
            acts.append(r)
    for r in df.to_dict("records"):
        if str(group[r["episode_id"]]) in held:  # scored as training would, trained on by nobody
            reward = reward_of(r, outcome[r["episode_id"]], trajectory, cfg.outcome_weight)
            rows.append(advantage_row(r, iteration, phase, reward, None, None) | {"held_out": True})
            acts.append(r)
    ctx.pipeline.weigh(rows, acts, np.random.default_rng(ctx.seed_for("balance", iteration, phase)))
    return rows


def advantage_row(r: dict, iteration: int, phase: str, reward, adv, raw) -> dict:
    """The `advantages` row of action `r`; no advantage: masked out."""
    n = len(r["response_ids"])
    return {k: r[k] for k in store.KEYS} | {
        "iteration": iteration,
        "phase": phase,
        "reward": reward,
        "advantages": (adv if adv is not None else np.zeros(n)).astype(np.float32).tolist(),
        "raw_advantages": None if raw is None else raw.astype(np.float32).tolist(),
        "loss_mask": [1 if adv is not None else 0] * n,
        "weight": 1 if adv is not None else 0,
        "held_out": False,
    }


def reward_of(r: dict, outcome: float, trajectory: bool, outcome_weight: float) -> float | None:
    """An action's reward: for a trajectory estimator the episode's outcome (None where an infrastructure
    fault made it meaningless), else its coach score blended with the outcome (None: unscored)."""
    if trajectory:
        return None if str(r["error_kind"]).startswith("infra_") else outcome
    coach = r["score"]
    ok = coach is not None and not (isinstance(coach, float) and np.isnan(coach))
    return blend_score(coach, outcome, outcome_weight) if ok else None


def positive_part(advs: list) -> list:
    """A' = max(A, 0) per token; an action without an advantage keeps none."""
    return [None if a is None else np.maximum(a, 0.0) for a in advs]


@stage("advantages")
def compute_advantages(run: RunContext, iteration: int, phase: str) -> list[dict]:
    """Per-token advantages and loss masks of every action of the partition."""
    return advantage_rows(run, iteration, phase)
