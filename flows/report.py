"""Per-iteration metrics read back from the trajectory store (for MLflow, the CLI and the demo)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infra import store
from tasks.evaluation import bootstrap_ci


def partition_metrics(run_dir: str | Path, iteration: int, phase: str) -> dict[str, float]:
    """Success, coach score and reward per agent, response length, code errors of one partition."""
    eps = store.read_table(run_dir, "episodes", iteration, phase)
    m: dict[str, float] = {}
    if len(eps):
        succ = eps["success"].astype(float).to_numpy()
        m["success_rate"] = float(succ.mean())
        if phase == "eval":
            lo, hi = bootstrap_ci(succ)
            m["success_ci_low"], m["success_ci_high"] = lo, hi
    acts = store.load_actions(run_dir, iteration, phase)
    for agent, g in acts.groupby("agent", sort=True):
        m[f"coach_score/{agent}"] = float(g["score"].astype(float).mean())
        m[f"response_tokens/{agent}"] = float(g["response_ids"].map(len).mean())
        if "reward" in g and g["reward"].notna().any():
            m[f"reward/{agent}"] = float(g["reward"].astype(float).mean())
        m[f"coach_missing/{agent}"] = float((g["status"] != "ok").sum()) if "status" in g else 0.0
    return m


def update_metrics(run_dir: str | Path, iteration: int) -> dict[str, float]:
    up = store.read_table(run_dir, "updates", iteration)
    m: dict[str, float] = {}
    for r in up.to_dict("records"):
        a = r["agent"]
        for k in ("loss", "kl", "surrogate_gain", "tokens", "seconds"):
            if r[k] is not None and not pd.isna(r[k]):
                m[f"{k}/{a}"] = float(r[k])
        m[f"skipped/{a}"] = float(bool(r["skipped"]))
        m[f"version/{a}"] = float(r["version_after"])
    return m


def run_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per (iteration, phase): success, per-agent coach score and loss."""
    rows = []
    eps = store.read_table(run_dir, "episodes")
    for (it, ph), _ in eps.groupby(["iteration", "phase"], sort=True):
        m = partition_metrics(run_dir, int(it), str(ph))
        if ph == "rollout" and (Path(run_dir) / "updates").is_dir():
            m |= {k: v for k, v in update_metrics(run_dir, int(it)).items() if k.startswith("loss/")}
        rows.append({"iteration": int(it), "phase": str(ph), **m})
    df = pd.DataFrame(rows)
    if not len(df):
        return df
    # eval at iteration K measures the policy after K updates, so it follows rollout K
    df["_after"] = df["phase"] == "eval"
    return df.sort_values(["iteration", "_after", "phase"]).drop(columns="_after").reset_index(drop=True)


def compact(df: pd.DataFrame) -> pd.DataFrame:
    """The columns a person reads first: success (with interval on eval), coach score and loss per agent."""
    keep = ["iteration", "phase", "success_rate", "success_ci_low", "success_ci_high"]
    keep += [c for c in df.columns if c.startswith(("coach_score/", "loss/"))]
    out = df[[c for c in keep if c in df.columns]]
    return out.rename(columns=lambda c: c.replace("success_rate", "success").replace("success_ci_", "ci ")
                      .replace("coach_score/", "coach\n").replace("loss/", "loss\n"))


def fmt(v) -> str:
    if isinstance(v, float):
        return "-" if np.isnan(v) else f"{v:.2f}"
    return str(v)
