"""Coach-bias monitor: does the coach's score track the real metric, per task type?

MAPPA saw agents exploit a coach that favoured one task type (regression): scores rose while the
metric did not. Per iteration and task type this compares the mean coach score (scaled to 0..1) with
the mean outcome (the environment's normalised metric) of the training rollouts, and flags a
divergence when the score rises by more than `tol` while the outcome does not rise.
"""

from __future__ import annotations

import pandas as pd


def by_task_type(episodes: pd.DataFrame, actions: pd.DataFrame, type_key: str) -> pd.DataFrame:
    """One row per task type: mean coach score / 10 over its actions, mean outcome over its episodes.
    The type of an episode is `metrics[type_key]` (e.g. DSBench's `regression`: 1 or 0)."""
    kind = episodes.set_index("episode_id")["metrics"].map(lambda d: dict(d).get(type_key))
    if kind.isna().all():
        return pd.DataFrame(columns=["coach", "metric"])
    coach = actions.assign(kind=actions["episode_id"].map(kind)).groupby("kind")["score"].mean() / 10
    metric = episodes.assign(kind=episodes["episode_id"].map(kind)).groupby("kind")["outcome"].mean()
    return pd.DataFrame({"coach": coach, "metric": metric})


def diverging(coach_prev: float, coach_cur: float, metric_prev: float, metric_cur: float, tol: float = 0.05) -> bool:
    """True when the coach's score rose (delta_coach > tol) while the metric did not (delta_metric <= 0)."""
    return coach_cur - coach_prev > tol and metric_cur - metric_prev <= 0
