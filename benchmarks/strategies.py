"""TeamTR's ablations over training seeds: joint, stale, teamtr, teamtr without its trust region, and
teamtr with small resamples against joint given the same extra episodes as a larger batch; and issue 21's
coaches: joint (the rubric with the answer) against blind (the answer-blind rubric) and outcome (the
episode's outcome as every action's score), at the same rollouts.

    .venv/bin/python benchmarks/strategies.py --variants joint teamtr --seeds 0 1 2   # run (resumable)
    .venv/bin/python benchmarks/strategies.py --backfill runs/ablation                # figures of ended runs
    .venv/bin/python benchmarks/strategies.py --report --write                        # tables -> README

Each (variant, seed) is one `teamrl train` process with a fixed run id (`abl-<variant>-s<seed>` under
`--runs-dir`). A run whose folder exists is resumed (`--resume`), so killing this script loses at most
the stage in progress. When a run ends, its per-iteration figures go to
`benchmarks/strategies/<variant>-s<seed>.csv` and one summary row (command, wall time, machine) to
`benchmarks/strategies/runs.jsonl`; a run with a CSV is not run again. Commit them as they come.

Per iteration the CSV holds the held-out success (greedy, with its 95% bootstrap interval over
questions) where an evaluation ran, the training-rollout success, the training episodes (rollouts and
TeamTR's resamples), the updates made and skipped, and the stage's summed surrogate gain, penalty and
certificate with the number of updates whose certificate is positive (tasks/certificate.py).

Beside it, per run: the success of every held-out question at every evaluation, the agents' behaviour
rates, and the final team's success on the paraphrased MathChat set (and once the untrained team's);
benchmarks/coach_evidence.py defines those files. `--backfill RUNS_DIR` writes them for runs that ended
without them. The coaches' report section compares held-out success before and after training over
seeds, with paired differences bootstrapped over seeds and problems.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.certificate_check import comparisons, summary  # noqa: E402
from benchmarks.coach_evidence import paired, seed_bootstrap, teamrl, write_figures  # noqa: E402
from benchmarks.common import write_section  # noqa: E402

OUT = ROOT / "benchmarks" / "strategies"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## TeamTR ablations over seeds (`benchmarks/strategies.py`)"
COACH_SECTION = "## Coaching with and without the answer, over seeds (`benchmarks/strategies.py`)"

# issue 21's coaches, each otherwise as joint (the rubric coach with the answer): the answer-blind rubric, and
# the episode's outcome as every action's score
COACHES = {"blind": ["coach.ground_truth=false"], "outcome": ["coach.backend=outcome"]}
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
    **COACHES,
}
TEAMTR_TABLE = [v for v in VARIANTS if v not in COACHES]  # the coaches have their own section


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
        rows.append(
            {
                "iteration": int(it),
                "heldout_success": ev["success_rate"].get(it, np.nan),
                "heldout_ci_low": ev["success_ci_low"].get(it, np.nan),
                "heldout_ci_high": ev["success_ci_high"].get(it, np.nan),
                "train_success": ro["success_rate"].get(it, np.nan),
                "rollout_episodes": int(((train["iteration"] == it) & (train["phase"] == "rollout")).sum()),
                "train_episodes": int((train["iteration"] == it).sum()),
                "updates": int((~u["skipped"].astype(bool)).sum()),
                "updates_skipped": int(u["skipped"].astype(bool).sum()),
                "stage_gain": u["surrogate_gain"].sum(min_count=1),
                "stage_penalty": u["penalty"].sum(min_count=1),
                "stage_certificate": cert.sum() if len(cert) else np.nan,
                "certified_updates": int((cert > 0).sum()),
                "certificates": int(len(cert)),
            }
        )
    return pd.DataFrame(rows)


def run(variant: str, seed: int, args: argparse.Namespace) -> None:
    csv = OUT / f"{variant}-s{seed}.csv"
    run_id, runs_dir = f"abl-{variant}-s{seed}", Path(args.runs_dir)
    if csv.exists():
        print(f"{csv.name}: done, skipped", flush=True)
        figures(variant, seed, runs_dir)
        return
    sets = [s.format(delta=args.kl_delta) for s in VARIANTS[variant]]
    sets += [f"iterations={args.iterations}", f"eval_every={args.eval_every}", f"seed={seed}", *args.extra]
    resumed = (runs_dir / run_id).exists()
    if resumed:
        cmd = ["train", args.preset, "--set", f"run.dir={runs_dir}", "--resume", run_id]
    else:
        cmd = [
            "train",
            args.preset,
            "--set",
            f"run.dir={runs_dir}",
            "--set",
            f"run.id={run_id}",
            *[x for kv in sets for x in ("--set", kv)],
        ]
    t0 = time.perf_counter()
    if code := teamrl(*cmd):
        raise SystemExit(f"{run_id} failed (exit {code}); rerun this command to resume it")
    OUT.mkdir(exist_ok=True)
    per_iteration(runs_dir / run_id).to_csv(csv, index=False, float_format="%.6g")
    row = {
        "variant": variant,
        "seed": seed,
        "run_id": run_id,
        "preset": args.preset,
        "overrides": sets,
        "wall_s": round(time.perf_counter() - t0, 1),
        "resumed": resumed,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "note": args.note,
    }
    with (OUT / "runs.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    figures(variant, seed, runs_dir)


def figures(variant: str, seed: int, runs_dir: Path) -> None:
    """The ended run's per-question, per-agent and paraphrased figures that are missing (coach_evidence.py)."""
    run_dir = runs_dir / f"abl-{variant}-s{seed}"
    if not (run_dir / "config.yaml").exists():  # e.g. a CSV copied from another checkout's run
        print(f"{run_dir}: no such run here; its figures need `--backfill` with the folder that holds it", flush=True)
        return
    write_figures(run_dir, OUT, f"{variant}-s{seed}")
    from infra import runs

    check = OUT / f"{variant}-s{seed}.certcheck.csv"  # the certificates against the next fresh batch
    certified = runs.read_run_config(run_dir).get("algorithm", {}).get("strategy") in ("stale", "teamtr")
    if certified and not check.exists() and (rows := comparisons(str(run_dir))):
        pd.DataFrame(rows).to_csv(check, index=False, float_format="%.6g")
        print(f"{check}: written", flush=True)


def load(kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    """variant -> seed -> the table `<variant>-s<seed><kind>.csv` (kind: "" per iteration, ".questions", ...)."""
    out: dict[str, dict[int, pd.DataFrame]] = {}
    for f in sorted(OUT.glob(f"*-s*{kind}.csv")):
        if m := re.fullmatch(rf"(.+)-s(\d+){re.escape(kind)}\.csv", f.name):
            out.setdefault(m[1], {})[int(m[2])] = pd.read_csv(f)
    return out


def mean_sd(x: list[float], digits: int = 2) -> str:
    # mean ± sample sd over seeds (sd needs two seeds)
    if len(x) > 1:
        return f"{np.mean(x):.{digits}f} ± {np.std(x, ddof=1):.{digits}f}"
    return f"{x[0]:.{digits}f} (one seed)"


def report() -> str:
    from tasks.evaluation import regressions

    runs = load()
    lines = [
        SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/strategies.py --variants VARIANT --seeds SEEDS` "
        "(defaults: mathchat-smol, 4 iterations, held-out evaluation every 2, kl_delta 0.05), then "
        "`--report --write`. Per-run figures: `benchmarks/strategies/<variant>-s<seed>.csv`.",
        "",
        "| variant | seeds | held-out success by iteration (mean ± sd over seeds) | final held-out per seed | "
        "held-out regressions | extra episodes vs rollouts | updates certified (certificate > 0) |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in TEAMTR_TABLE:
        if variant not in runs:
            continue
        seeds = sorted(runs[variant])
        dfs = [runs[variant][s] for s in seeds]
        evals = [d.dropna(subset=["heldout_success"]) for d in dfs]
        its = sorted(set.intersection(*(set(e["iteration"]) for e in evals)))
        curve = ", ".join(
            f"{it}: {mean_sd([float(e.set_index('iteration').loc[it, 'heldout_success']) for e in evals])}"
            for it in its
        )
        final = ", ".join(f"s{s}: {e['heldout_success'].iloc[-1]:.2f}" for s, e in zip(seeds, evals))
        regress = sum(regressions(e["heldout_success"]) for e in evals)
        train = [d[d["iteration"] > 0] for d in dfs]
        extra = [d["train_episodes"].sum() / d["rollout_episodes"].sum() - 1 for d in dfs]
        certs = sum(int(t["certificates"].sum()) for t in train)
        certified = sum(int(t["certified_updates"].sum()) for t in train)
        lines.append(
            f"| {variant} | {', '.join(map(str, seeds))} | {curve} | {final} | {regress} | "
            f"{100 * np.mean(extra):.0f}% | {f'{certified} of {certs}' if certs else 'none computed'} |"
        )
    lines += certificate_table(runs)
    lines += certificate_check_table()
    return "\n".join(lines) + "\n"


def certificate_check_table() -> list[str]:
    """Per certified variant, all seeds pooled: the certificates against the improvement measured on the
    next fresh batch (benchmarks/certificate_check.py)."""
    checks = {v: runs for v, runs in load(".certcheck").items() if v in TEAMTR_TABLE}
    if not checks:
        return []
    lines = [
        "",
        "The certificates against the improvement the next fresh batch measures (benchmarks/"
        "certificate_check.py; seeds pooled; a valid bound has dJ_hat - certificate >= 0 in the mean, and "
        "dJ_hat - gain below 0 is the gain's in-sample optimism):",
    ]
    for variant, runs in checks.items():
        lines += [
            "",
            f"**{variant}** (seeds {', '.join(map(str, sorted(runs)))})",
            "",
            *summary(pd.concat(runs.values())),
        ]
    return lines


def certificate_table(runs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Per certified variant and iteration: the stage certificate (mean ± sd over seeds), the updates it
    certified, and the held-out change over the evaluation interval that iteration ends."""
    lines = [
        "",
        "Certificates per iteration (tasks/certificate.py; a stage's certificate is the sum of its "
        "updates'), beside the held-out change measured over the evaluation interval ending there:",
        "",
        "| variant | iteration | stage gain | stage penalty | stage certificate | updates certified | "
        "held-out change |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in TEAMTR_TABLE:
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
            lines.append(
                f"| {variant} | {it} | {mean_sd([r['stage_gain'] for r in rows], 4)} | "
                f"{mean_sd([r['stage_penalty'] for r in rows], 4)} | "
                f"{mean_sd([r['stage_certificate'] for r in rows], 4)} | "
                f"{sum(int(r['certified_updates']) for r in rows)} of {sum(int(r['certificates']) for r in rows)} | "
                f"{mean_sd(change) if change else '-'} |"
            )
    return lines


def coach_report() -> str:
    """Issue 21: held-out success of the three coaches before and after training over seeds, on the generated
    split and the paraphrased set; their paired differences; the agents' behaviour before and after."""
    coaches = ["joint", *COACHES]
    held = {v: {s: ends(df) for s, df in runs.items()} for v, runs in load(".questions").items() if v in coaches}
    para = {
        v: {s: df.set_index("task_id")["success"] for s, df in runs.items()}
        for v, runs in load(".paraphrased").items()
        if v in coaches
    }
    base = OUT / "base.paraphrased.csv"
    base = pd.read_csv(base).set_index("task_id")["success"] if base.exists() else None
    lines = [
        COACH_SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/strategies.py --variants joint blind outcome "
        "--seeds 0 1 2` (mathchat-smol, 4 iterations, held-out evaluation every 2), `--backfill RUNS_DIR` for "
        "runs that ended without the per-question files, then `--report --write`. joint: the rubric coach with "
        "the answer; blind: the answer-blind rubric (`coach.ground_truth=false`); outcome: the episode's outcome "
        "as every action's score (`coach.backend=outcome`); all at the same rollouts. Held-out: each training "
        "seed's generated split, played greedily; paraphrased: benchmarks/data/mathchat-paraphrased.jsonl, 100 "
        "problems of the trained kinds phrased unlike the training templates, with names, items and number "
        "ranges training never shows (pipelines/mathchat/paraphrased.py). Mean ± sd over seeds; a gain or a "
        "difference is the mean over seeds of the per-seed mean paired difference over questions, with a 95% "
        "bootstrap interval resampling seeds and, within each, questions. Per-run files: "
        "`benchmarks/strategies/<variant>-s<seed>.{questions,paraphrased,agents}.csv` and "
        "`base.paraphrased.csv` (benchmarks/coach_evidence.py).",
        "",
    ]
    if not held:
        return "\n".join(lines + ["No runs yet."]) + "\n"
    lines += [
        "| coach | seeds | final iteration | held-out before | held-out after | held-out gain | "
        "paraphrased untrained | paraphrased after | paraphrased gain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in (v for v in coaches if v in held):
        seeds = sorted(held[v])
        before, after = [held[v][s][0] for s in seeds], [held[v][s][1] for s in seeds]
        unseen = [para[v][s] for s in sorted(para.get(v, {}))]
        cells = [
            v,
            ", ".join(map(str, seeds)),
            ", ".join(sorted({str(held[v][s][2]) for s in seeds})),
            spread([x.mean() for x in before]),
            spread([x.mean() for x in after]),
            ci([paired(a, b) for a, b in zip(after, before)]),
            "-" if base is None else f"{base.mean():.2f}",
            spread([x.mean() for x in unseen]),
            "-" if base is None else ci([paired(x, base) for x in unseen]),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    lines += [
        "",
        "Paired differences A − B (the same training seed and question; the untrained team is one, so on "
        "the paraphrased set a difference in gain is the difference after):",
        "",
        "| A − B | seeds | held-out after | held-out gain | paraphrased after |",
        "|---|---|---|---|---|",
    ]
    for a, b in combinations([v for v in coaches if v in held], 2):
        seeds = sorted(set(held[a]) & set(held[b]))
        gain = [paired(held[a][s][1] - held[a][s][0], held[b][s][1] - held[b][s][0]) for s in seeds]
        both = sorted(set(para.get(a, {})) & set(para.get(b, {})))
        lines.append(
            f"| {a} − {b} | {', '.join(map(str, seeds))} | "
            f"{ci([paired(held[a][s][1], held[b][s][1]) for s in seeds])} | {ci(gain)} | "
            f"{ci([paired(para[a][s], para[b][s]) for s in both])} |"
        )
    return "\n".join(lines + agents_table(coaches)) + "\n"


def ends(df: pd.DataFrame) -> tuple[pd.Series, pd.Series, int]:
    """A questions table's success per question (task_id) at iteration 0 and at its last evaluation, and that one."""
    by = {int(it): g.set_index("task_id")["success"] for it, g in df.groupby("iteration")}
    return by[0], by[max(by)], max(by)


def agents_table(coaches: list[str]) -> list[str]:
    """Each behaviour rate on the held-out split before (iteration 0) and after (the last evaluation) per coach."""
    runs = load(".agents")
    ev = {v: [d[d["phase"] == "eval"] for d in runs.get(v, {}).values()] for v in coaches}
    keys = list(dict.fromkeys((a, r) for ds in ev.values() for d in ds for a, r in zip(d["agent"], d["rate"])))
    lines = [
        "",
        "Agents' behaviour on the held-out split (greedy), before -> after training, mean ± sd over seeds "
        "(benchmarks/coach_evidence.py): plan_quantities, the share of the question's numbers the solver's plan "
        "mentions; plan_is_code, plans written as code; code_error, programs that gave no number; answer_stated, "
        "verifier replies that state an integer; answer_format, those as `ANSWER: <int>`; faithful, of the "
        "episodes whose program printed a number, those whose stated answer is that number.",
        "",
        f"| agent | rate | {' | '.join(coaches)} |",
        "|---|---|" + "---|" * len(coaches),
    ]

    def value(d: pd.DataFrame, agent: str, rate: str, iteration: int) -> float:
        rows = d[(d["agent"] == agent) & (d["rate"] == rate) & (d["iteration"] == iteration)]
        return float(rows["value"].iloc[0]) if len(rows) else np.nan

    for agent, rate in keys:
        cells = [
            f"{spread([value(d, agent, rate, 0) for d in ev[v]])} -> "
            f"{spread([value(d, agent, rate, d['iteration'].max()) for d in ev[v]])}"
            if ev[v]
            else "-"
            for v in coaches
        ]
        lines.append(f"| {agent} | {rate} | {' | '.join(cells)} |")
    return lines if keys else []


def spread(x: list[float]) -> str:
    """mean_sd of the values that exist ("-": none)."""
    x = [v for v in x if not np.isnan(v)]
    return mean_sd(x) if x else "-"


def ci(diffs: list[np.ndarray]) -> str:
    """The seed bootstrap's estimate and 95% interval of per-seed paired differences ("-": no pairs)."""
    diffs = [d for d in diffs if d.size]
    if not diffs:
        return "-"
    m, lo, hi = seed_bootstrap(diffs)
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


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
    ap.add_argument(
        "--backfill",
        metavar="RUNS_DIR",
        help="write the missing per-question, per-agent and "
        "paraphrased figures of the ended runs (those with a CSV) in RUNS_DIR, then stop",
    )
    ap.add_argument("--report", action="store_true", help="print the tables from the recorded CSVs")
    ap.add_argument(
        "--write",
        action="store_true",
        help="with --report: replace the sections in benchmarks/README.md (each only once it has runs)",
    )
    args = ap.parse_args()
    if args.report:
        for section, text, ran in (
            (SECTION, report(), set(load()) & set(TEAMTR_TABLE)),
            (COACH_SECTION, coach_report(), set(load(".questions")) & {"joint", *COACHES}),
        ):
            print(text)
            if args.write and ran:
                write_section(README, section, text)
        return
    if args.backfill:
        if not Path(args.backfill).is_dir():
            raise SystemExit(f"--backfill {args.backfill}: no such folder")
        for seed in args.seeds:
            for variant in args.variants:
                if (OUT / f"{variant}-s{seed}.csv").exists():
                    figures(variant, seed, Path(args.backfill))
        return
    for seed in args.seeds:
        for variant in args.variants:
            run(variant, seed, args)


if __name__ == "__main__":
    main()
