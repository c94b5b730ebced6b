"""Measure `make demo` (the mathchat-smol preset): wall time, peak memory, held-out success before and
after training with 95% intervals, per seed and per coach backend (process rewards vs outcome-only).

    .venv/bin/python benchmarks/demo.py --seeds 0 1 2 --backends rubric outcome

Each run is a separate `teamrl train` process (peak RSS read from the OS). Results are appended to
benchmarks/demo_results.jsonl and the table is printed as markdown for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_one(preset: str, seed: int, backend: str, runs_dir: Path, extra: list[str]) -> dict:
    from flows.report import compact, run_table

    run_id = f"bench-{preset}-{backend}-s{seed}-{int(time.time())}"
    cmd = [
        str(ROOT / ".venv/bin/teamrl"),
        "train",
        preset,
        "--set",
        f"seed={seed}",
        "--set",
        f"coach.backend={backend}",
        "--set",
        f"run.dir={runs_dir}",
        "--set",
        f"run.id={run_id}",
        *extra,
    ]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"}
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    ev = compact(run_table(runs_dir / run_id))
    ev = ev[ev["phase"] == "eval"]
    a, b = ev.iloc[0], ev.iloc[-1]
    return {
        "preset": preset,
        "seed": seed,
        "backend": backend,
        "run_id": run_id,
        "wall_s": round(wall, 1),
        "peak_rss_gib": round(max(peak_kb, before) / 2**20, 2),
        "before": [a["success"], a["ci low"], a["ci high"]],
        "after": [b["success"], b["ci low"], b["ci high"]],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "extra": extra,
    }


def record(out: Path, row: dict) -> None:
    """Append one result row to the JSONL file `out` and print it."""
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mathchat-smol")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--backends", nargs="+", default=["rubric", "outcome"])
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra key=value overrides")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "demo_results.jsonl"
    rows = []
    for backend in args.backends:
        for seed in args.seeds:
            r = run_one(
                args.preset, seed, backend, Path(args.runs_dir), [x for kv in args.extra for x in ("--set", kv)]
            )
            rows.append(r)
            record(out, r)
    print("\n| backend | seed | untrained success [95% CI] | trained success [95% CI] | change | wall | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        (a, al, ah), (b, bl, bh) = r["before"], r["after"]
        print(
            f"| {r['backend']} | {r['seed']} | {a:.2f} [{al:.2f}, {ah:.2f}] | {b:.2f} [{bl:.2f}, {bh:.2f}] | "
            f"{100 * (b - a):+.0f} pp | {r['wall_s'] / 60:.1f} min | {r['peak_rss_gib']:.1f} GiB |"
        )


if __name__ == "__main__":
    main()
