"""A run's metrics as people read them: the per-iteration table, the held-out problems one by one, the
summary plot and markdown (for the CLI, the demo and the Prefect artifacts); flows/metrics.py computes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flows.metrics import greedy_flags, is_eval, partition_metrics, update_metrics
from infra import store


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def problem_table(run_dir: str | Path, iteration: int, phase: str = "eval", width: int = 60) -> pd.DataFrame:
    """One row per problem of an evaluation partition (its greedy episodes, in problem order): the episode,
    the question and the team's final answer (cut to `width` characters), the expected answer, and success
    (yes / no, or `infra error` for an episode an infrastructure fault hit, which the success rate leaves out)."""
    eps = store.read_table(run_dir, "episodes", iteration, phase)
    eps = eps[greedy_flags(eps) == 1.0].sort_values("episode_id")
    success = [
        ("infra error" if isinstance(f, str) else "yes" if s else "no")
        for s, f in zip(eps["success"], eps["infra_error"])
    ]
    return pd.DataFrame(
        {
            "episode": eps["episode_id"],
            "question": eps["question"].map(lambda q: _cut(q, width)),
            "final answer": eps["final_answer"].map(lambda a: _cut(a, width)),
            "expected": eps["answer"].map(lambda a: _cut(a, width)),
            "success": success,
        }
    )


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
    df["_after"] = df["phase"].map(is_eval)
    return df.sort_values(["iteration", "_after", "phase"]).drop(columns="_after").reset_index(drop=True)


def compact(df: pd.DataFrame) -> pd.DataFrame:
    """The columns a person reads first: success (with interval on eval), coach score and loss per agent."""
    keep = ["iteration", "phase", "success_rate", "success_ci_low", "success_ci_high"]
    keep += [c for c in df.columns if c.startswith(("coach_score/", "loss/"))]
    out = df[[c for c in keep if c in df.columns]]
    return out.rename(
        columns=lambda c: (
            c.replace("success_rate", "success")
            .replace("success_ci_", "ci ")
            .replace("coach_score/", "coach\n")
            .replace("loss/", "loss\n")
        )
    )


def fmt(v) -> str:
    if isinstance(v, float):
        return "-" if np.isnan(v) else f"{v:.2f}"
    return str(v)


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """PNG: held-out and training success per iteration (with 95% intervals on held-out), and the mean
    coach score of each agent per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = run_table(run_dir)
    out = Path(out or Path(run_dir) / "summary.png")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    tr, ev = df[df["phase"] == "rollout"], df[df["phase"] == "eval"]
    if len(tr):
        ax1.plot(tr["iteration"], tr["success_rate"], "o-", label="training rollouts (sampled)")
    if len(ev):
        err = np.vstack([ev["success_rate"] - ev["success_ci_low"], ev["success_ci_high"] - ev["success_rate"]])
        ax1.errorbar(
            ev["iteration"], ev["success_rate"], yerr=err, fmt="s--", capsize=4, label="held-out (greedy, 95% CI)"
        )
    ax1.set(xlabel="iteration", ylabel="success rate", title="team success", ylim=(-0.02, 1.02))
    ax1.legend(loc="best", fontsize=8)
    for col in [c for c in tr.columns if c.startswith("coach_score/")]:
        ax2.plot(tr["iteration"], tr[col], "o-", label=col.split("/", 1)[1])
    ax2.set(xlabel="iteration", ylabel="mean coach score (0-10)", title="coach score per agent", ylim=(0, 10.2))
    ax2.legend(loc="best", fontsize=8)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def summary_markdown(run_dir: str | Path) -> str:
    """Before/after held-out success with intervals, and the per-iteration table, as markdown."""
    df = compact(run_table(run_dir))
    ev = df[df["phase"] == "eval"]
    lines = [f"# {Path(run_dir).name}", ""]
    if len(ev) >= 2:
        a, b = ev.iloc[0], ev.iloc[-1]
        lines += [
            f"Held-out success: **{a['success']:.3f}** [{a['ci low']:.3f}, {a['ci high']:.3f}] at iteration "
            f"{int(a['iteration'])} -> **{b['success']:.3f}** [{b['ci low']:.3f}, {b['ci high']:.3f}] at "
            f"iteration {int(b['iteration'])} (greedy, 95% bootstrap CI)",
            "",
        ]
    cols = [c.replace("\n", " ") for c in df.columns]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)
