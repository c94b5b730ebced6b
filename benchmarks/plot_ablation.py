"""Process vs outcome rewards at an equal number of rollouts: the curves of the `benchmarks/demo.py` runs.

    .venv/bin/python benchmarks/plot_ablation.py            # reads runs/bench, writes benchmarks/ablation.png

Left: success of the sampled training rollouts per iteration (8 questions x 4 episodes); right:
held-out greedy success before and after training with its 95% bootstrap interval. One line per run,
coloured by coach backend.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COLORS = {"rubric": "tab:blue", "llm": "tab:green", "outcome": "tab:red"}


def main() -> None:
    from flows.report import compact, run_table
    from infra.runs import list_runs, read_run_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "ablation.png"))
    args = ap.parse_args()
    fig, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, rid in enumerate(list_runs(args.runs_dir)):
        cfg = read_run_config(Path(args.runs_dir) / rid)
        backend, seed = cfg["coach"]["backend"], cfg["seed"]
        t = compact(run_table(Path(args.runs_dir) / rid))
        roll, ev = t[t["phase"] == "rollout"], t[t["phase"] == "eval"]
        label = f"{backend}, seed {seed}"
        train_ax.plot(roll["iteration"], roll["success"], marker="o", color=COLORS.get(backend), label=label, alpha=0.8)
        x = ev["iteration"] + 0.08 * i
        eval_ax.errorbar(
            x,
            ev["success"],
            yerr=[ev["success"] - ev["ci low"], ev["ci high"] - ev["success"]],
            marker="o",
            capsize=3,
            color=COLORS.get(backend),
            label=label,
            alpha=0.8,
        )
    train_ax.set(title="training rollouts (sampled, 32 per iteration)", xlabel="iteration", ylabel="success")
    eval_ax.set(title="held-out, greedy (100 problems, 95% CI)", xlabel="policy iteration", ylabel="success")
    for ax in (train_ax, eval_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("mathchat-smol: process rewards (rubric coach) vs outcome-only, equal rollouts")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
