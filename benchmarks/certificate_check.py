"""TeamTR's certificate against the improvement measured on the next fresh batch, in stored training runs.

    .venv/bin/python benchmarks/certificate_check.py RUN_DIR [RUN_DIR ...]    # --csv FILE: per-update rows

In a `teamtr` iteration, agent i's update is fitted on a batch its team pi^(i-1) sampled (the rollout,
or resample-i), and the next batch (resample-(i+1), or the next iteration's rollout after the last
agent) is sampled by pi^i on other questions drawn from the same training set. A batch's mean episode
return is an unbiased estimate of its team's J, so

    dJ_hat = J_hat(next batch) - J_hat(this batch)

estimates the update's true improvement J(pi^i) - J(pi^(i-1)) without bias, with the noise of a few
episodes on other questions. The certificate (tasks/certificate.py) is a 95% lower bound on the task
return's change, computed on the question groups held out of the update (runs recorded before those
groups existed certified on the batch the update was fitted to, whose noise made the gain optimistic).
Over many updates, then:
  - mean(dJ_hat - certificate) >= 0 is what a valid bound predicts (a negative mean, beyond its interval,
    means the certificates claimed more than the updates did);
  - mean(dJ_hat - surrogate gain) estimates the gain's optimism (0 for an unbiased surrogate, up to the
    occupancy-shift term the penalty bounds).
The interval of a mean over updates is exact for the estimates' sampling noise: each batch estimate enters
with its coefficient (+1 as the next batch of one update, -1 as the batch of the next), batches are
independent, and each batch's standard error is clustered by question group.

A return is what the certificate bounds: the sum of the actions' blended coach scores (an unscored action
adds nothing), without the KL shaping (`episode_returns` with beta = 0).
`stale` and `joint` have no per-update batch after each update; their stage (one iteration) is compared
the same way: the stage's summed certificate against J_hat(next rollout) - J_hat(rollout).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from infra import store  # noqa: E402
from tasks.advantages import kl_penalty  # noqa: E402
from tasks.algorithm import AlgorithmConfig  # noqa: E402
from tasks.certificate import cluster_se  # noqa: E402
from tasks.context import RunContext  # noqa: E402

Z95_TWO_SIDED = 1.959963984540054


def episode_returns(actions: pd.DataFrame, rewards: pd.DataFrame, beta: float, kind: str) -> pd.Series:
    """Per episode: sum of its actions' rewards (None: 0) - beta * sum of its tokens' KL to the reference."""
    r = rewards.set_index(["episode_id", "turn", "agent"])["reward"].astype(float).fillna(0.0)
    kl = actions.apply(
        lambda a: (
            0.0
            if beta == 0 or a["ref_logprobs"] is None
            else float(
                np.sum(
                    kl_penalty(np.asarray(a["logprobs"], np.float64), np.asarray(a["ref_logprobs"], np.float64), kind)
                )
            )
        ),
        axis=1,
    )
    per_action = (
        r.reindex(pd.MultiIndex.from_frame(actions[["episode_id", "turn", "agent"]])).fillna(0.0).to_numpy()
        - beta * kl.to_numpy()
    )
    return pd.Series(per_action, index=actions["episode_id"].to_numpy()).groupby(level=0).sum()


def batch_estimate(run_dir: str, iteration: int, phase: str, cfg: AlgorithmConfig) -> tuple[float, float]:
    """(J_hat, its standard error clustered by group) of one stored batch."""
    actions = store.load_actions(run_dir, iteration, phase)
    rewards = store.read_table(run_dir, "advantages", iteration, phase)
    groups = store.read_table(run_dir, "episodes", iteration, phase).set_index("episode_id")["group_id"]
    ret = episode_returns(actions, rewards, 0.0, cfg.kl_estimator)  # the task return: the certified J
    return float(ret.mean()), cluster_se(ret.to_numpy(), [str(groups[e]) for e in ret.index])


def comparisons(run_dir: str) -> list[dict]:
    """One row per certified update (`teamtr`), or per stage (`stale`, and `teamtr` stages too): its
    certificate and gain beside dJ_hat, with the batches each estimate came from."""
    cfg = RunContext(run_dir).config.algorithm
    updates = store.read_table(run_dir, "updates")
    updates = updates[updates["phase"].isin(["rollout"]) | updates["phase"].str.startswith("resample")]
    phases = store.read_table(run_dir, "episodes")[["iteration", "phase"]].drop_duplicates()
    have = set(map(tuple, phases.itertuples(index=False)))
    cache: dict[tuple, tuple[float, float]] = {}

    def est(it, ph):
        if (it, ph) not in cache:
            cache[(it, ph)] = batch_estimate(run_dir, it, ph, cfg)
        return cache[(it, ph)]

    rows = []
    for it, u in updates.groupby("iteration"):
        nxt = (it + 1, "rollout")
        order = sorted(u["phase"].unique(), key=lambda p: 0 if p == "rollout" else int(p.split("-")[1]))
        done = u[~u["skipped"].astype(bool)]
        if cfg.strategy == "teamtr":
            for k, ph in enumerate(order):
                after = (it, order[k + 1]) if k + 1 < len(order) else nxt
                row = done[done["phase"] == ph]
                if len(row) != 1 or after not in have or pd.isna(row["certificate"].iloc[0]):
                    continue
                rows.append(
                    _row(
                        run_dir,
                        "update",
                        it,
                        row["agent"].iloc[0],
                        (it, ph),
                        after,
                        est,
                        float(row["certificate"].iloc[0]),
                        float(row["surrogate_gain"].iloc[0]),
                    )
                )
        certs = done["certificate"].dropna()
        if len(certs) and nxt in have and len(certs) == len(done):
            rows.append(
                _row(
                    run_dir,
                    "stage",
                    it,
                    "+".join(done["agent"]),
                    (it, "rollout"),
                    nxt,
                    est,
                    float(certs.sum()),
                    float(done["surrogate_gain"].sum()),
                )
            )
    return rows


def _row(run_dir, kind, it, agent, before, after, est, cert, gain) -> dict:
    (j0, s0), (j1, s1) = est(*before), est(*after)
    return {
        "run": Path(run_dir).name,
        "kind": kind,
        "iteration": it,
        "agent": agent,
        "batch": f"{before[0]}/{before[1]}",
        "next_batch": f"{after[0]}/{after[1]}",
        "j_before": j0,
        "j_after": j1,
        "se_before": s0,
        "se_after": s1,
        "dj_hat": j1 - j0,
        "certificate": cert,
        "gain": gain,
    }


def mean_interval(df: pd.DataFrame, column: str) -> tuple[float, float]:
    """mean(dj_hat - column) over rows and its 95% half-width: var = sum_b c_b^2 se_b^2 over batches b,
    c_b the batch's summed coefficient (+1/n as a next batch, -1/n as a fitted one)."""
    n = len(df)
    coef: dict[str, float] = {}
    se: dict[str, float] = {}
    for r in df.itertuples():
        for key, c, s in ((f"{r.run}:{r.next_batch}", 1 / n, r.se_after), (f"{r.run}:{r.batch}", -1 / n, r.se_before)):
            coef[key] = coef.get(key, 0.0) + c
            se[key] = s
    half = Z95_TWO_SIDED * math.sqrt(sum(coef[k] ** 2 * se[k] ** 2 for k in coef))
    return float((df["dj_hat"] - df[column]).mean()), half


def summary(df: pd.DataFrame) -> list[str]:
    lines = [
        "| rows | n | mean certificate | mean gain | mean dJ_hat | dJ_hat - certificate (95%) | "
        "dJ_hat - gain (95%) | certificate > 0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, d in df.groupby("kind", sort=False):
        (mc, hc), (mg, hg) = mean_interval(d, "certificate"), mean_interval(d, "gain")
        lines.append(
            f"| {kind} | {len(d)} | {d['certificate'].mean():+.4f} | {d['gain'].mean():+.4f} | "
            f"{d['dj_hat'].mean():+.4f} | {mc:+.4f} ± {hc:.4f} | {mg:+.4f} ± {hg:.4f} | "
            f"{int((d['certificate'] > 0).sum())} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders")
    ap.add_argument("--csv", help="write the per-update and per-stage rows here")
    args = ap.parse_args()
    df = pd.DataFrame([r for run in args.runs for r in comparisons(run)])
    if df.empty:
        raise SystemExit(
            "no certified update with a later batch in these runs (strategy stale or teamtr, "
            "at least two iterations or a resample after the update)"
        )
    if args.csv:
        df.to_csv(args.csv, index=False, float_format="%.6g")
    print("\n".join(summary(df)))


if __name__ == "__main__":
    main()
