"""DSBench over training seeds (issue 21): does the data-science team, trained on four of scikit-learn's
bundled datasets, solve tasks on datasets it never saw, on the `dsbench-smol` preset.

    .venv/bin/python benchmarks/dsbench.py --variants unseen --seeds 0 1    # run (resumable)
    .venv/bin/python benchmarks/dsbench.py --report --write                 # tables -> benchmarks/README.md

Variants: `unseen` (the preset: held-out tasks on `digits` and on synthetic make_classification /
make_regression tables whose shapes and generator seeds are drawn from the run seed) and `splits` (held-out
tasks on new splits of the training datasets, `pipeline.heldout=splits`, which measures those four datasets
only). Each (variant, seed) is one `teamrl train` process with a fixed run id (`ds-<variant>-s<seed>` under
`--runs-dir`); a run whose folder exists is resumed, so killing this script loses at most the stage in
progress. When a run ends, its figures go to `benchmarks/dsbench/<variant>-s<seed>.csv` (per iteration) and
`.tasks.csv` (every held-out task at every evaluation), one summary row to `benchmarks/dsbench/runs.jsonl`;
a run with a CSV is not run again.

Per iteration: held-out success (greedy; a valid submission that beats the trivial predictor), its 95%
bootstrap interval over tasks, valid submissions; on the training rollouts: success, valid submissions,
each agent's delivery rate (its program ran and wrote its hand-off files), the mean reward and the
update's seconds. Per held-out task: its dataset, kind, success, and the metric (macro F1 for
classification, fair RMSE, the RMSE over that of predicting the training mean, for regression).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.coach_evidence import paired, seed_bootstrap  # noqa: E402
from benchmarks.seeds import (  # noqa: E402
    cli,
    episode_table,
    eval_table,
    load_tables,
    parser,
    run_and_record,
    wall_minutes,
)
from benchmarks.strategies_report import mean_sd  # noqa: E402

OUT = ROOT / "benchmarks" / "dsbench"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## DSBench over seeds (`benchmarks/dsbench.py`)"
VARIANTS = {"unseen": [], "splits": ["pipeline.heldout=splits"]}
AGENTS = ("data_engineer", "modeler", "analyst")
METRIC = {"classification": "f1", "regression": "fair_rmse"}


def episodes(run_dir: Path) -> pd.DataFrame:
    """The run's scored episodes with their metrics as columns, each task's dataset and kind."""
    eps = episode_table(run_dir)
    eps = eps[eps["infra_error"].isna()].copy()  # an episode the scorer or sandbox failed has no known outcome
    eps["dataset"] = [str(t).rsplit("-", 1)[0] for t in eps["task_id"]]
    eps["kind"] = eps["regression"].map({1.0: "regression", 0.0: "classification"})
    eps["success"] = eps["success"].astype(float)
    return eps


def per_iteration(run_dir: Path) -> pd.DataFrame:
    """One row per iteration: held-out figures where an evaluation ran (iteration 0: the untrained team),
    training-rollout figures where one ran."""
    from infra import store

    ev_table = eval_table(run_dir)
    eps = episodes(run_dir)
    up = store.read_table(run_dir, "updates")
    rows = []
    for it in sorted(eps["iteration"].unique()):
        ev = eps[(eps["iteration"] == it) & (eps["phase"] == "eval") & (eps["greedy"] == 1.0)]
        ro = eps[(eps["iteration"] == it) & (eps["phase"] == "rollout")]
        row: dict = {"iteration": int(it)}
        if len(ev):
            row |= {
                "heldout_success": ev["success"].mean(),
                "heldout_ci_low": ev_table["success_ci_low"].get(it, np.nan),
                "heldout_ci_high": ev_table["success_ci_high"].get(it, np.nan),
                "heldout_valid": ev["submission_ok"].mean(),
            }
        if len(ro):
            row |= {
                "train_success": ro["success"].mean(),
                "train_valid": ro["submission_ok"].mean(),
                **{f"train_{a}_delivered": ro[f"{a}_ok"].mean() for a in AGENTS},
                "train_reward": ro["outcome"].mean(),
                "update_s": up[up["iteration"] == it]["seconds"].sum(),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def tasks(run_dir: Path) -> pd.DataFrame:
    """Every greedy held-out episode: iteration, task, dataset, kind, success, valid submission, each agent's
    delivery and the metric (`METRIC`: macro F1 or fair RMSE; empty without a valid submission)."""
    eps = episodes(run_dir)
    ev = eps[(eps["phase"] == "eval") & (eps["greedy"] == 1.0)].copy()
    metric = [r.get(METRIC[k], np.nan) for r, k in zip(ev.to_dict("records"), ev["kind"])]
    ev["metric"] = np.where(ev["submission_ok"] == 1.0, metric, np.nan)
    cols = ["iteration", "task_id", "dataset", "kind", "success", "submission_ok"]
    cols += [*(f"{a}_ok" for a in AGENTS), "metric"]
    return ev[cols].sort_values(["iteration", "task_id"])


def run(variant: str, seed: int, args: argparse.Namespace) -> None:
    def write(run_dir: Path) -> None:
        tasks(run_dir).to_csv(OUT / f"{variant}-s{seed}.tasks.csv", index=False, float_format="%.6g")
        per_iteration(run_dir).to_csv(OUT / f"{variant}-s{seed}.csv", index=False, float_format="%.6g")

    run_and_record(OUT, args, variant, seed, f"ds-{variant}-s{seed}", VARIANTS[variant], write)


def load(kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    return load_tables(OUT, kind)


def ends(t: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A `.tasks` table's first and last evaluation."""
    its = sorted(t["iteration"].unique())
    return t[t["iteration"] == its[0]], t[t["iteration"] == its[-1]]


def by_dataset(ts: dict[int, pd.DataFrame]) -> list[str]:
    """Table rows (without the variant's cell): per held-out dataset, tasks per seed, success and the metric
    first -> last evaluation, each the mean ± sd over seeds of the seed's mean (the metric over its valid
    submissions; a seed without one has none)."""
    rows = []
    first = {s: ends(t)[0] for s, t in ts.items()}
    datasets = sorted(set.union(*(set(f["dataset"]) for f in first.values())))
    for d in datasets:
        at = {s: tuple(e[e["dataset"] == d] for e in ends(t)) for s, t in ts.items()}
        at = {s: v for s, v in at.items() if len(v[0])}
        kind = next(iter(at.values()))[0]["kind"].iloc[0]
        n = sorted({len(v[0]) for v in at.values()})
        cells = []
        for col in ("success", "metric"):
            ba = [[float(v[i][col].mean()) for v in at.values()] for i in (0, 1)]
            ba = [[x for x in side if not np.isnan(x)] for side in ba]
            cells.append(" -> ".join(mean_sd(side) if side else "-" for side in ba))
        name = "macro F1" if kind == "classification" else "fair RMSE"
        rows.append(f"{d} | {kind} | {'/'.join(map(str, n))} | {cells[0]} | {name} {cells[1]}")
    return rows


def report() -> str:
    runs, ts = load(), load(".tasks")
    walls = wall_minutes(OUT)
    lines = [
        SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/dsbench.py --variants VARIANT --seeds SEEDS` (defaults: "
        "dsbench-smol, its 6 iterations, held-out evaluation before and after), then `--report --write`. "
        "`unseen`: the preset's 24 held-out tasks on datasets training never sees (`digits` and four synthetic "
        "tables, whose shapes and generator seeds differ by run seed); `splits`: new splits of the four training "
        "datasets. Success: a valid submission that beats the trivial predictor (majority class, or the training "
        "mean). Mean ± sd over seeds; a gain is the mean over seeds of the per-seed mean paired difference over "
        "tasks, with a 95% bootstrap interval resampling seeds and, within each, tasks. Per-run files: "
        "`benchmarks/dsbench/<variant>-s<seed>.csv` and `.tasks.csv`; wall times and what shared the machine: "
        "`benchmarks/dsbench/runs.jsonl`.",
        "",
        "| variant | seeds | held-out success before -> after | gain | valid submissions before -> after | "
        "training success, first -> last iteration | wall per run (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        if variant not in runs:
            continue
        seeds = sorted(runs[variant])
        diffs, succ, valid = [], [[], []], [[], []]
        for s in seeds:
            first, last = (e.set_index("task_id") for e in ends(ts[variant][s]))
            diffs.append(paired(last["success"], first["success"]))
            for i, e in enumerate((first, last)):
                succ[i].append(float(e["success"].mean()))
                valid[i].append(float(e["submission_ok"].mean()))
        gain, lo, hi = seed_bootstrap(diffs)
        tr = [runs[variant][s].dropna(subset=["train_success"])["train_success"] for s in seeds]
        wall = [walls[(variant, s)] for s in seeds if (variant, s) in walls]
        lines.append(
            f"| {variant} | {', '.join(map(str, seeds))} | {mean_sd(succ[0])} -> {mean_sd(succ[1])} | "
            f"{gain:+.2f} [{lo:+.2f}, {hi:+.2f}] | {mean_sd(valid[0])} -> {mean_sd(valid[1])} | "
            f"{mean_sd([float(t.iloc[0]) for t in tr])} -> {mean_sd([float(t.iloc[-1]) for t in tr])} | "
            f"{mean_sd(wall, 0) if wall else '-'} |"
        )
    lines += [
        "",
        "Per held-out dataset, first -> last evaluation (mean ± sd over seeds of each seed's rate; the metric "
        "over valid submissions only).",
        "",
        "| variant | dataset | kind | tasks per seed | success | metric |",
        "|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        if variant in ts:
            lines += [f"| {variant} | {row} |" for row in by_dataset(ts[variant])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = parser(
        __doc__,
        preset="dsbench-smol",
        variants=list(VARIANTS),
        default=["unseen"],
        seeds=[0, 1],
        iterations=6,
        eval_every=0,
        runs_dir=ROOT / "runs" / "dsbench",
    )
    cli(ap, OUT, README, SECTION, report, run)


if __name__ == "__main__":
    main()
