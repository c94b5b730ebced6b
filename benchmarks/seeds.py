"""What the runners over training seeds share (benchmarks/strategies.py, benchmarks/mars.py): one
resumable `teamrl train` process per (variant, seed) with a fixed run id, a summary row per finished run in
`<out>/runs.jsonl`, and the per-run CSVs read back by variant and seed."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from benchmarks.coach_evidence import teamrl


def run_and_record(
    out: Path, args, variant: str, seed: int, run_id: str, sets: list[str], write: Callable[[Path], None]
) -> None:
    """Train run `run_id` (`args.preset`, under `args.runs_dir`) with the overrides `sets`, or resume it where
    its folder exists; then `write(run folder)` its figures and append its summary row (wall time, whether
    it was resumed, the machine, `args.note`) to `out`/runs.jsonl. A failed run stops the script with how
    to go on."""
    runs_dir = Path(args.runs_dir)
    resumed = (runs_dir / run_id).exists()
    cmd = ["train", args.preset, "--set", f"run.dir={runs_dir}"]
    cmd += ["--resume", run_id] if resumed else [x for kv in [f"run.id={run_id}", *sets] for x in ("--set", kv)]
    t0 = time.perf_counter()
    if code := teamrl(*cmd):
        raise SystemExit(f"{run_id} failed (exit {code}); rerun this command to resume it")
    wall_s = round(time.perf_counter() - t0, 1)
    out.mkdir(exist_ok=True)
    write(runs_dir / run_id)
    row = {"variant": variant, "seed": seed, "run_id": run_id, "preset": args.preset, "overrides": sets}
    row |= {"wall_s": wall_s, "resumed": resumed, "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    with (out / "runs.jsonl").open("a") as fh:
        fh.write(json.dumps(row | {"note": args.note}) + "\n")


def load_tables(out: Path, kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    """variant -> seed -> the table `<out>/<variant>-s<seed><kind>.csv` (kind: "" per iteration, ".questions", ...)."""
    tables: dict[str, dict[int, pd.DataFrame]] = {}
    for f in sorted(out.glob(f"*-s*{kind}.csv")):
        if m := re.fullmatch(rf"(.+)-s(\d+){re.escape(kind)}\.csv", f.name):
            tables.setdefault(m[1], {})[int(m[2])] = pd.read_csv(f)
    return tables
