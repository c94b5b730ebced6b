"""DAG stage `compute_advantages`: per-token advantages and loss masks; the `advantages` partition."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from infra import store
from tasks import context
from tasks.advantages import TRAJECTORY_ESTIMATORS, Sample, blend_score, estimate
from tasks.balanced_sampling import balanced_counts
from tasks.stage import stage


def advantage_rows(run_dir: str, iteration: int, phase: str) -> list[dict]:
    cfg = context.of(run_dir).config.algorithm
    df = store.load_actions(run_dir, iteration, phase)
    eps = store.read_table(run_dir, "episodes", iteration, phase).set_index("episode_id")
    outcome, group = eps["outcome"].to_dict(), eps["group_id"].to_dict()
    records = df.to_dict("records")
    trajectory = cfg.estimator in TRAJECTORY_ESTIMATORS
    # REINFORCE++ normalises over one agent's samples (an agent sharing a model with others too: their scores
    # may differ in scale), GRPO / RLOO per group within them; a
    # trajectory estimator sees every agent's samples at once, scored with the episode's reward.
    batches = (
        [records]
        if trajectory
        else [[r for r in records if r["agent"] == a] for a in sorted({r["agent"] for r in records})]
    )
    rows = []
    for recs in batches:
        samples = []
        for r in recs:
            coach = r["score"]
            ok = coach is not None and not (isinstance(coach, float) and np.isnan(coach))
            if trajectory:  # the episode's reward, unless an infrastructure fault made its outcome meaningless
                s = None if str(r["error_kind"]).startswith("infra_") else outcome[r["episode_id"]]
            else:
                s = blend_score(coach, outcome[r["episode_id"]], cfg.outcome_weight) if ok else None
            ref = None if r["ref_logprobs"] is None else np.asarray(r["ref_logprobs"], np.float64)
            samples.append(
                Sample(
                    r["episode_id"],
                    group[r["episode_id"]],
                    r["agent"],
                    int(r["turn"]),
                    np.asarray(r["logprobs"], np.float64),
                    ref,
                    s,
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
        if trajectory and cfg.system1_credit == "coach":
            system1_coach_credit(recs, samples, advs, raws, cfg.whiten_eps)
        if cfg.positive_only:
            advs = positive_part(advs)
        for r, smp, a, raw in zip(recs, samples, advs, raws):
            n = len(r["response_ids"])
            rows.append(
                {k: r[k] for k in store.KEYS}
                | {
                    "iteration": iteration,
                    "phase": phase,
                    "reward": smp.score,
                    "system": int(r["system"]),
                    "advantages": (a if a is not None else np.zeros(n)).astype(np.float32).tolist(),
                    "raw_advantages": None if raw is None else raw.astype(np.float32).tolist(),
                    "loss_mask": [1 if a is not None else 0] * n,
                    "weight": 1 if a is not None else 0,
                }
            )
    rng = np.random.default_rng(context.of(run_dir).seed_for("balance", iteration, phase))
    balance_system1(rows, cfg.balance, rng)
    return [{k: v for k, v in r.items() if k != "system"} for r in rows]


def system1_coach_credit(recs: list[dict], samples: list[Sample], advs: list, raws: list, eps: float) -> None:
    """Replace System-1 samples' trajectory advantages, in place, by GRPO over their own coach scores
    (s = coach / 10) within their question's group; an unscored extraction gets none."""
    idx = [i for i, r in enumerate(recs) if int(r["system"]) == 1]
    own = [replace(samples[i], score=_coach_score(recs[i]["score"])) for i in idx]
    scaled, raw = estimate("grpo", own, eps=eps), estimate("grpo", own, eps=eps, scale=False)
    for k, i in enumerate(idx):
        samples[i], advs[i], raws[i] = own[k], scaled[k], raw[k]


def positive_part(advs: list) -> list:
    """A' = max(A, 0) per token; an action without an advantage keeps none."""
    return [None if a is None else np.maximum(a, 0.0) for a in advs]


def _coach_score(score) -> float | None:
    """A coach score 0..10 as a reward in [0, 1]; None where the coach gave none."""
    return None if score is None or not np.isfinite(score) else float(score) / 10.0


def balance_system1(rows: list[dict], mode: str, rng: np.random.Generator) -> None:
    """MARS: set System-1 rows' `weight` (duplication count) so they number exactly as many as System 2's
    samples, one per trajectory, drawn with p ~ |A| (`advantage`) or uniformly; `off` keeps every one once."""
    s1 = [r for r in rows if r["system"] == 1 and r["weight"] > 0]
    if not s1 or mode == "off":
        return
    target = len({r["episode_id"] for r in rows if r["system"] == 2 and r["weight"] > 0})
    mean_abs = [float(np.abs(r["advantages"]).mean()) if r["advantages"] else 0.0 for r in s1]
    for r, c in zip(s1, balanced_counts(np.array(mean_abs), target, mode, rng)):
        r["weight"] = int(c)


@stage("advantages")
def compute_advantages(run_dir: str, iteration: int, phase: str) -> list[dict]:
    """Per-token advantages and loss masks of every action of the partition."""
    return advantage_rows(run_dir, iteration, phase)
