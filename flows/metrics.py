"""Per-iteration metrics computed from the trajectory store: what MLflow logs, the flows return and the
reports tabulate (flows/report.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infra import store
from infra.retry import INFRA_KINDS, infra_kind
from tasks.coach import ERROR_KINDS, STATUSES
from tasks.evaluation import bootstrap_ci, pass_at_k


def is_eval(phase: str) -> bool:
    """Held-out evaluation partitions: `eval`, and `eval-<what>` (e.g. the swap-shock ones of flows/align.py)."""
    return phase.split("-", 1)[0] == "eval"


def partition_metrics(run_dir: str | Path, iteration: int, phase: str) -> dict[str, float]:
    """Success, coach score and reward per agent, response length, the pipeline's episode metrics of one
    partition (`episode/<key>` and its own, Pipeline.episode_metrics), the
    number of actions per coach status and error kind (`coach_status/<status>`, `coach_error/<kind>`) and
    of episodes per infrastructure fault kind (`infra_error/<kind>`). Success counts only the episodes no
    infrastructure fault hit; on an evaluation partition also per group of problems (`group_success`)."""
    eps = store.read_table(run_dir, "episodes", iteration, phase)
    m: dict[str, float] = {}
    flag = greedy_flags(eps)
    evaluation = is_eval(phase)
    sampled = eps[flag == 0.0] if evaluation else eps.iloc[0:0]
    main = eps[flag == 1.0] if evaluation else eps
    ran = main[main["infra_error"].isna()]  # an episode an infrastructure fault hit measures the host, not the team
    if len(ran):
        succ = ran["success"].astype(float).to_numpy()
        m["success_rate"] = float(succ.mean())
        if evaluation:
            lo, hi = bootstrap_ci(succ)
            m["success_ci_low"], m["success_ci_high"] = lo, hi
            m |= group_success(ran)
    if len(main):
        em = pd.DataFrame([dict(d) for d in main["metrics"]]).drop(columns=["greedy"], errors="ignore")
        m |= {f"episode/{k}": float(v) for k, v in em.mean().items()}  # the pipeline's per-episode metrics
        m |= pipeline_of(main).episode_metrics(em)
    kinds = eps["infra_error"].dropna().map(infra_kind).value_counts()
    m |= {f"infra_error/{k}": float(kinds.get(k, 0)) for k in INFRA_KINDS}  # episodes an infrastructure fault hit
    if len(sampled):
        per_q = sampled.groupby("group_id")["success"].agg(["size", "sum"])
        k = int(per_q["size"].min())
        m[f"pass_at_{k}"] = float(np.mean([pass_at_k(int(n), int(c), k) for n, c in per_q.itertuples(index=False)]))
    acts = store.load_actions(run_dir, iteration, phase)
    if evaluation:
        acts = acts[acts["episode_id"].isin(set(main["episode_id"]))]
    for agent, g in acts.groupby("agent", sort=True):
        m[f"coach_score/{agent}"] = float(g["score"].astype(float).mean())
        m[f"response_tokens/{agent}"] = float(g["response_ids"].map(len).mean())
        m[f"tool_use/{agent}"] = float((g["tool_input"].fillna("") != "").mean())
        if "reward" in g and g["reward"].notna().any():
            m[f"reward/{agent}"] = float(g["reward"].astype(float).mean())
        m[f"coach_missing/{agent}"] = float((~g["status"].isin(["ok", "skipped"])).sum()) if "status" in g else 0.0
    for col, names, prefix in (("status", STATUSES, "coach_status"), ("error_kind", ERROR_KINDS, "coach_error")):
        if col in acts:  # how many actions got each value (0 for the ones that did not occur)
            counts = acts[col].dropna().value_counts()
            for name in dict.fromkeys([*names, *counts.index]):
                m[f"{prefix}/{name}"] = float(counts.get(name, 0))
    return m


def pipeline_of(eps: pd.DataFrame):
    """The pipeline class that played the episodes `eps` (its static hooks read stored data)."""
    from pipelines import PIPELINES  # a slow import (every pipeline): the partitions that need it import it

    return PIPELINES[eps["pipeline"].iloc[0]]


def greedy_flags(eps: pd.DataFrame) -> pd.Series:
    """Each episode's `greedy` flag (1.0: a greedy evaluation episode; 0.0: sampled)."""
    return eps["metrics"].map(lambda d: dict(d).get("greedy", 0.0)) if len(eps) else eps["metrics"]


def group_success(eps: pd.DataFrame) -> dict[str, float]:
    """`success/<group>`: the success rate of `eps` per group of problems, where their pipeline groups them
    (Pipeline.group_of; DSBench: per dataset, so held-out success shows which unseen datasets the team solves)."""
    from pipelines.base import Problem

    group_of = pipeline_of(eps).group_of
    groups = [group_of(Problem(t, q, a)) for t, q, a in zip(eps["task_id"], eps["question"], eps["answer"])]
    df = pd.DataFrame({"group": groups, "success": eps["success"].astype(float).to_numpy()})
    rates = df.groupby("group")["success"].mean()  # a problem without a group (None) is left out
    return {f"success/{g}": float(r) for g, r in rates.items()}


UPDATE_COLUMNS = (
    "loss",
    "kl",
    "surrogate_gain",
    "penalty",
    "certificate",
    "tokens",
    "seconds",
    "over_length",
    "grad_norm",
    "clip_frac",
    "kl_ref",
)


METRIC = {"certificate": "task_certificate"}  # the MLflow name of an `updates` column, where it differs


def update_metrics(run_dir: str | Path, iteration: int) -> dict[str, float]:
    """Per agent: loss, KL, surrogate gain, penalty, certificate (`task_certificate/<agent>`: it bounds the
    task return, without KL shaping), tokens, seconds, samples left out for their length (`over_length`),
    gradient norm, clip fraction, KL to the reference (`kl_ref`), skipped, version; per stage (`stage/*`):
    the sums of KL, gain and penalty over the agents' updates, `stage/task_certificate` (Theorem 3.6's
    stage certificate: the sum of the updates' certificates, logged only when every applied update of a
    stage / teamtr stage has one) and `stage/certified`, the number of updates whose certificate is positive."""
    up = store.read_table(run_dir, "updates", iteration)
    up = up[up["strategy"] != "stage0"]  # Stage-0 alignments (flows/align.py) log their own metrics
    m: dict[str, float] = {}
    for r in up.to_dict("records"):
        a = r["agent"]
        for k in UPDATE_COLUMNS:
            if r[k] is not None and not pd.isna(r[k]):
                m[f"{METRIC.get(k, k)}/{a}"] = float(r[k])
        m[f"skipped/{a}"] = float(bool(r["skipped"]))
        m[f"version/{a}"] = float(r["version_after"])
    for k in ("kl", "surrogate_gain", "penalty"):
        if up[k].notna().any():
            m[f"stage/{k}"] = float(up[k].dropna().astype(float).sum())
    applied = up[(up["strategy"] != "joint") & ~up["skipped"].astype(bool)]
    if len(applied) and applied["certificate"].notna().all():
        m["stage/task_certificate"] = float(applied["certificate"].astype(float).sum())
    if up["certificate"].notna().any():
        m["stage/certified"] = float((up["certificate"].dropna().astype(float) > 0).sum())
    return m


def agent_table(m: dict[str, float], agents: list[str]) -> list[dict]:
    """One row per agent from an iteration's metrics: every `<metric>/<agent>` key as column `<metric>`."""
    return [
        {"agent": a, **{k.rsplit("/", 1)[0]: round(v, 4) for k, v in m.items() if k.endswith(f"/{a}")}} for a in agents
    ]
