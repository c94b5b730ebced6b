"""Compare the team update strategies' learning curves: joint, stale and teamtr on one preset and seed.

    .venv/bin/python benchmarks/strategies.py --preset mathchat-smol --seed 0 --eval-every 2

Each strategy is one `teamrl train` process (benchmarks/demo.py's runner) with `eval_every` set, so the
held-out success is measured every few iterations. Per strategy: the held-out curve, its regressions
(drops between consecutive evaluations), the same for training-rollout success, the final held-out
success with its interval, the summed improvement certificates and the extra rollouts/tokens TeamTR's
resampling cost. Rows go to benchmarks/strategies_results.jsonl; a markdown table is printed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# strategy -> overrides; stale and teamtr share the trust region so they differ only in resampling
STRATEGIES = {
    "joint": [],
    "stale": ["algorithm.strategy=stale", "algorithm.kl_delta={delta}"],
    "teamtr": ["algorithm.strategy=teamtr", "algorithm.kl_delta={delta}"],
}


def curves(run_dir: Path) -> dict:
    """Held-out and training curves, regressions, certificates and resampling cost of one run folder."""
    from flows.report import is_eval, run_table
    from infra import store
    from tasks.evaluation import regressions

    df = run_table(run_dir)
    ev = df[df["phase"].map(is_eval)]
    ro = df[df["phase"] == "rollout"]
    up = store.read_table(run_dir, "updates")
    eps = store.read_table(run_dir, "episodes")
    train_eps = eps[(eps["phase"] == "rollout") | eps["phase"].str.startswith("resample")]
    sizes = train_eps.groupby("phase").size()
    last = ev.iloc[-1]
    return {
        "eval_iterations": ev["iteration"].tolist(), "eval_success": ev["success_rate"].round(3).tolist(),
        "eval_regressions": regressions(ev["success_rate"]),
        "final": [last["success_rate"], last["success_ci_low"], last["success_ci_high"]],
        "train_success": ro["success_rate"].round(3).tolist(), "train_regressions": regressions(ro["success_rate"]),
        "certificate_sum": float(up["certificate"].fillna(0).sum()),
        "skipped_updates": int(up["skipped"].sum()), "updates": len(up),
        "extra_episodes_frac": float(sizes.drop("rollout", errors="ignore").sum() / sizes["rollout"]),
    }


def main() -> None:
    from benchmarks.demo import record, run_one

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mathchat-smol")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--kl-delta", type=float, default=0.05)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra key=value overrides")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "strategies_results.jsonl"
    rows = []
    for name in args.strategies:
        sets = [s.format(delta=args.kl_delta) for s in STRATEGIES[name]] + [f"eval_every={args.eval_every}", *args.extra]
        r = run_one(args.preset, args.seed, "rubric", Path(args.runs_dir), [x for kv in sets for x in ("--set", kv)])
        r = {"strategy": name, **r, **curves(Path(args.runs_dir) / r["run_id"])}
        rows.append(r)
        record(out, r)
    print("\n| strategy | held-out curve (iteration: success) | regressions held-out / training | final held-out "
          "[95% CI] | certificate sum | skipped updates | extra episodes | wall |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        curve = ", ".join(f"{i}: {s:.2f}" for i, s in zip(r["eval_iterations"], r["eval_success"]))
        f, lo, hi = r["final"]
        print(f"| {r['strategy']} | {curve} | {r['eval_regressions']} / {r['train_regressions']} | {f:.2f} [{lo:.2f}, "
              f"{hi:.2f}] | {r['certificate_sum']:.3f} | {r['skipped_updates']}/{r['updates']} | "
              f"{100 * r['extra_episodes_frac']:.0f}% | {r['wall_s'] / 60:.1f} min |")


if __name__ == "__main__":
    main()
