"""TeamTR's ablations over training seeds: joint, stale, teamtr, teamtr without its trust region, and
teamtr with small resamples against joint given the same extra episodes as a larger batch; and issue 21's
coaches: joint (the rubric with the answer) against blind (the answer-blind rubric), outcome (the
episode's outcome as every action's score) and llm (SmolLM2-135M-Instruct as the judge, with the answer,
served by `transformers serve` on 127.0.0.1:8000 for as long as its run trains), at the same rollouts.

    .venv/bin/python benchmarks/strategies.py --variants joint teamtr --seeds 0 1 2   # run (resumable)
    .venv/bin/python benchmarks/strategies.py --variants llm --seeds 0 --iterations 2 # the LLM coach
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

This file runs the ablations and records their figures; the variants are defined in
benchmarks/strategies_variants.py and the report is made by benchmarks/strategies_report.py.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.certificate_check import comparisons  # noqa: E402
from benchmarks.coach_evidence import write_figures  # noqa: E402
from benchmarks.seeds import parser, run_all, run_and_record  # noqa: E402
from benchmarks.strategies_report import print_report  # noqa: E402
from benchmarks.strategies_variants import LLM_COACH_PORT, OUT, VARIANTS  # noqa: E402
from infra.local_llm import transformers_serve  # noqa: E402
from infra.models import smollm2_dir  # noqa: E402


def per_iteration(run_dir: Path) -> pd.DataFrame:
    """One row per training iteration (and iteration 0: the untrained team's held-out success)."""
    from flows.metrics import is_eval
    from flows.report import run_table
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
    model = smollm2_dir()
    sets = [s.format(delta=args.kl_delta, smollm2=model) for s in VARIANTS[variant]]
    with ExitStack() as stack:
        if "coach.backend=llm" in sets and not csv.exists():  # the coach's server lives as long as the run
            stack.enter_context(transformers_serve(model, port=LLM_COACH_PORT))
        run_and_record(
            OUT,
            args,
            variant,
            seed,
            f"abl-{variant}-s{seed}",
            sets,
            lambda run_dir: per_iteration(run_dir).to_csv(csv, index=False, float_format="%.6g"),
        )
    figures(variant, seed, Path(args.runs_dir))


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


def main() -> None:
    ap = parser(
        __doc__,
        preset="mathchat-smol",
        variants=list(VARIANTS),
        default=list(VARIANTS),
        seeds=[0, 1, 2],
        iterations=4,
        eval_every=2,
        runs_dir=ROOT / "runs" / "ablation",
    )
    ap.add_argument("--kl-delta", type=float, default=0.05)
    ap.add_argument(
        "--backfill",
        metavar="RUNS_DIR",
        help="write the missing per-question, per-agent and "
        "paraphrased figures of the ended runs (those with a CSV) in RUNS_DIR, then stop",
    )
    args = ap.parse_args()
    if args.report:
        print_report(args.write)
        return
    if args.backfill:
        if not Path(args.backfill).is_dir():
            raise SystemExit(f"--backfill {args.backfill}: no such folder")
        for seed in args.seeds:
            for variant in args.variants:
                if (OUT / f"{variant}-s{seed}.csv").exists():
                    figures(variant, seed, Path(args.backfill))
        return
    run_all(args, run)


if __name__ == "__main__":
    main()
