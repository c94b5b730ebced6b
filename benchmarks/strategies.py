"""TeamTR's ablations over training seeds: joint, stale, teamtr, teamtr without its trust region, and
teamtr with small resamples against joint given the same extra episodes as a larger batch.

    .venv/bin/python benchmarks/strategies.py --variants joint teamtr --seeds 0 1 2   # run (resumable)
    .venv/bin/python benchmarks/strategies.py --report --write                        # table -> README

Each (variant, seed) is one `teamrl train` process with a fixed run id (`abl-<variant>-s<seed>` under
`--runs-dir`). A run whose folder exists is resumed (`--resume`), so killing this script loses at most
the stage in progress. When a run ends, its per-iteration figures go to
`benchmarks/strategies/<variant>-s<seed>.csv` and one summary row (command, wall time, machine) to
`benchmarks/strategies/runs.jsonl`; a run with a CSV is not run again. Commit them as they come.

Per iteration the CSV holds the held-out success (greedy, with its 95% bootstrap interval over
questions) where an evaluation ran, the training-rollout success, the training episodes (rollouts and
TeamTR's resamples), the updates made and skipped, and the stage's summed surrogate gain, penalty and
certificate with the number of updates whose certificate is positive (tasks/certificate.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_section  # noqa: E402
OUT = ROOT / "benchmarks" / "strategies"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## TeamTR ablations over seeds (`benchmarks/strategies.py`)"

# variant -> overrides; stale and teamtr share the trust region, so they differ only in resampling
VARIANTS = {
    "joint": [],
    "teamtr": ["algorithm.strategy=teamtr", "algorithm.kl_delta={delta}"],
    "stale": ["algorithm.strategy=stale", "algorithm.kl_delta={delta}"],
    "teamtr-d0.01": ["algorithm.strategy=teamtr", "algorithm.kl_delta=0.01"],  # a tighter trust region
    "teamtr-no-tr": ["algorithm.strategy=teamtr", "algorithm.kl_delta=null"],
    # one question per resample: the smallest TeamTR overhead this batch allows
    "teamtr-rq1": ["algorithm.strategy=teamtr", "algorithm.kl_delta={delta}", "algorithm.resample_questions=1"],
    # joint given teamtr-rq1's extra episodes (2 resamples x 1 question) as a larger batch
    "joint-q10": ["rollout.questions=10"],
}


def per_iteration(run_dir: Path) -> pd.DataFrame:
    """One row per training iteration (and iteration 0: the untrained team's held-out success)."""
    from flows.report import is_eval, run_table
    from infra import store

    df = run_table(run_dir)
    ev = df[df["phase"].map(is_eval)].set_index("iteration")
    ro = df[df["phase"] == "rollout"].set_index("iteration")
    eps = store.read_table(run_dir, "episodes")
    train = eps[(eps["phase"] == "rollout") | eps["phase"].str.startswith("resample")]
    up = store.read_table(run_dir, "updates")
    rows = []
    for it in sorted(set(ev.index) | set(ro.index)):
        u = up[up["iteration"] == it]
        cert = u["certificate"].dropna() if "certificate" in u else pd.Series(dtype=float)
        rows.append({
            "iteration": int(it),
            "heldout_success": ev["success_rate"].get(it, np.nan),
            "heldout_ci_low": ev["success_ci_low"].get(it, np.nan),
            "heldout_ci_high": ev["success_ci_high"].get(it, np.nan),
            "train_success": ro["success_rate"].get(it, np.nan),
            "rollout_episodes": int(((train["iteration"] == it) & (train["phase"] == "rollout")).sum()),
            "train_episodes": int((train["iteration"] == it).sum()),
            "updates": int((~u["skipped"].astype(bool)).sum()), "updates_skipped": int(u["skipped"].astype(bool).sum()),
            "stage_gain": u["surrogate_gain"].sum(min_count=1), "stage_penalty": u["penalty"].sum(min_count=1),
            "stage_certificate": cert.sum() if len(cert) else np.nan,
            "certified_updates": int((cert > 0).sum()), "certificates": int(len(cert)),
        })
    return pd.DataFrame(rows)


def run(variant: str, seed: int, args: argparse.Namespace) -> None:
    csv = OUT / f"{variant}-s{seed}.csv"
    if csv.exists():
        print(f"{csv.name}: done, skipped", flush=True)
        return
    run_id, runs_dir = f"abl-{variant}-s{seed}", Path(args.runs_dir)
    sets = [s.format(delta=args.kl_delta) for s in VARIANTS[variant]]
    sets += [f"iterations={args.iterations}", f"eval_every={args.eval_every}", f"seed={seed}", *args.extra]
    teamrl = [sys.executable, "-m", "flows.cli"]  # this checkout's code, whatever else is installed
    resumed = (runs_dir / run_id).exists()
    if resumed:
        cmd = [*teamrl, "train", args.preset, "--set", f"run.dir={runs_dir}", "--resume", run_id]
    else:
        cmd = [*teamrl, "train", args.preset, "--set", f"run.dir={runs_dir}", "--set", f"run.id={run_id}",
               *[x for kv in sets for x in ("--set", kv)]]
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=os.environ | {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"})
    if proc.returncode != 0:
        raise SystemExit(f"{run_id} failed (exit {proc.returncode}); rerun this command to resume it")
    OUT.mkdir(exist_ok=True)
    per_iteration(runs_dir / run_id).to_csv(csv, index=False, float_format="%.6g")
    row = {"variant": variant, "seed": seed, "run_id": run_id, "preset": args.preset, "overrides": sets,
           "wall_s": round(time.perf_counter() - t0, 1), "resumed": resumed,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "note": args.note}
    with (OUT / "runs.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def load() -> dict[str, dict[int, pd.DataFrame]]:
    out: dict[str, dict[int, pd.DataFrame]] = {}
    for f in sorted(OUT.glob("*-s*.csv")):
        variant, seed = re.fullmatch(r"(.+)-s(\d+)\.csv", f.name).groups()
        out.setdefault(variant, {})[int(seed)] = pd.read_csv(f)
    return out


def mean_sd(x: list[float], digits: int = 2) -> str:
    # mean ± sample sd over seeds (sd needs two seeds)
    if len(x) > 1:
        return f"{np.mean(x):.{digits}f} ± {np.std(x, ddof=1):.{digits}f}"
    return f"{x[0]:.{digits}f} (one seed)"


def report() -> str:
    from tasks.evaluation import regressions

    runs = load()
    lines = [SECTION, "", "Commands: `.venv/bin/python benchmarks/strategies.py --variants VARIANT --seeds SEEDS` "
             "(defaults: mathchat-smol, 4 iterations, held-out evaluation every 2, kl_delta 0.05), then "
             "`--report --write`. Per-run figures: `benchmarks/strategies/<variant>-s<seed>.csv`.", "",
             "| variant | seeds | held-out success by iteration (mean ± sd over seeds) | final held-out per seed | "
             "held-out regressions | extra episodes vs rollouts | updates certified (certificate > 0) |",
             "|---|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        if variant not in runs:
            continue
        seeds = sorted(runs[variant])
        dfs = [runs[variant][s] for s in seeds]
        evals = [d.dropna(subset=["heldout_success"]) for d in dfs]
        its = sorted(set.intersection(*(set(e["iteration"]) for e in evals)))
        curve = ", ".join(f"{it}: {mean_sd([float(e.set_index('iteration').loc[it, 'heldout_success']) for e in evals])}"
                          for it in its)
        final = ", ".join(f"s{s}: {e['heldout_success'].iloc[-1]:.2f}" for s, e in zip(seeds, evals))
        regress = sum(regressions(e["heldout_success"]) for e in evals)
        train = [d[d["iteration"] > 0] for d in dfs]
        extra = [d["train_episodes"].sum() / d["rollout_episodes"].sum() - 1 for d in dfs]
        certs = sum(int(t["certificates"].sum()) for t in train)
        certified = sum(int(t["certified_updates"].sum()) for t in train)
        lines.append(f"| {variant} | {', '.join(map(str, seeds))} | {curve} | {final} | {regress} | "
                     f"{100 * np.mean(extra):.0f}% | {f'{certified} of {certs}' if certs else 'none computed'} |")
    lines += certificate_table(runs)
    return "\n".join(lines) + "\n"


def certificate_table(runs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Per certified variant and iteration: the stage certificate (mean ± sd over seeds), the updates it
    certified, and the held-out change over the evaluation interval that iteration ends."""
    lines = ["", "Certificates per iteration (tasks/certificate.py; a stage's certificate is the sum of its "
             "updates'), beside the held-out change measured over the evaluation interval ending there:", "",
             "| variant | iteration | stage gain | stage penalty | stage certificate | updates certified | "
             "held-out change |", "|---|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        dfs = runs.get(variant, {})
        if not dfs or not any(d["certificates"].sum() for d in dfs.values()):
            continue
        for it in sorted(set.intersection(*(set(d["iteration"]) for d in dfs.values())) - {0}):
            rows = [d.set_index("iteration").loc[it] for d in dfs.values()]
            change = []
            for d in dfs.values():
                ev = d.dropna(subset=["heldout_success"]).set_index("iteration")["heldout_success"]
                if it in ev.index and len(ev.loc[:it]) > 1:
                    change.append(float(ev.loc[it] - ev.loc[:it].iloc[-2]))
            lines.append(f"| {variant} | {it} | {mean_sd([r['stage_gain'] for r in rows], 4)} | "
                         f"{mean_sd([r['stage_penalty'] for r in rows], 4)} | "
                         f"{mean_sd([r['stage_certificate'] for r in rows], 4)} | "
                         f"{sum(int(r['certified_updates']) for r in rows)} of {sum(int(r['certificates']) for r in rows)} | "
                         f"{mean_sd(change) if change else '-'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="mathchat-smol")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--kl-delta", type=float, default=0.05)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "ablation"))
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra key=value overrides")
    ap.add_argument("--note", default="", help="recorded with each run, e.g. what else shared the CPUs")
    ap.add_argument("--report", action="store_true", help="print the table from the recorded CSVs")
    ap.add_argument("--write", action="store_true", help="with --report: replace the section in benchmarks/README.md")
    args = ap.parse_args()
    if args.report:
        text = report()
        print(text)
        if args.write:
            write_section(README, SECTION, text)
        return
    for seed in args.seeds:
        for variant in args.variants:
            run(variant, seed, args)


if __name__ == "__main__":
    main()
