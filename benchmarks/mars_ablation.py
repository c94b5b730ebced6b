"""MARS with and without System 1 (`pipeline.system1=false`) on the deepresearch-smol preset.

    .venv/bin/python benchmarks/mars_ablation.py --seed 0

Each variant is one `teamrl train` process (benchmarks/demo.py's runner). Per variant: held-out EM and
F1 before and after training (greedy), and averaged over the training rollouts: tool calls per
episode, System-1 compression (raw tokens in / extracted tokens out), FFD bins vs the lower bound
ceil(sum of lengths / capacity), System 2's context tokens. Rows go to benchmarks/mars_results.jsonl.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def summary(run_dir: Path) -> dict:
    """Held-out EM/F1 first and last, and the rollout averages of the MARS metrics."""
    from flows.metrics import is_eval
    from flows.report import run_table

    df = run_table(run_dir)
    ev, ro = df[df["phase"].map(is_eval)], df[df["phase"] == "rollout"]

    def col(frame, name):
        return frame[name].round(3).tolist() if name in frame else []

    out = {
        "eval_iterations": ev["iteration"].tolist(),
        "eval_em": col(ev, "success_rate"),
        "eval_f1": col(ev, "episode/f1"),
        "train_f1": col(ro, "episode/f1"),
    }
    for k in (
        "episode/tool_calls",
        "system1/compression",
        "system1/bins_over_lower_bound",
        "episode/s2_context_tokens",
    ):
        out[k] = float(ro[k].mean()) if k in ro and ro[k].notna().any() else None
    return out


def main() -> None:
    from benchmarks.demo import record, run_one

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="deepresearch-smol")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", default=["system1", "no-system1"], choices=["system1", "no-system1"])
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra key=value overrides")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "mars_results.jsonl"
    rows = []
    for v in args.variants:
        sets = [f"pipeline.system1={'true' if v == 'system1' else 'false'}", *args.extra]
        r = run_one(args.preset, args.seed, "outcome", Path(args.runs_dir), [x for kv in sets for x in ("--set", kv)])
        r = {"variant": v, **r, **summary(Path(args.runs_dir) / r["run_id"])}
        rows.append(r)
        record(out, r)

    def fmt(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    print(
        "\n| variant | held-out EM before -> after [95% CI] | held-out F1 before -> after | tool calls / episode "
        "| System-1 compression | bins / lower bound | System-2 context tokens | wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        (a, _, _), (b, lo, hi) = r["before"], r["after"]
        f = r["eval_f1"]
        print(
            f"| {r['variant']} | {a:.2f} -> {b:.2f} [{lo:.2f}, {hi:.2f}] | {fmt(f[0])} -> {fmt(f[-1])} | "
            f"{fmt(r['episode/tool_calls'])} | {fmt(r['system1/compression'], '.1f')} | "
            f"{fmt(r['system1/bins_over_lower_bound'])} | {fmt(r['episode/s2_context_tokens'], '.0f')} | "
            f"{r['wall_s'] / 60:.1f} min |"
        )


if __name__ == "__main__":
    main()
