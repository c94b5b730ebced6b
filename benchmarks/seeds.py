"""What the runners over training seeds share (benchmarks/strategies.py, benchmarks/mars.py): one
resumable `teamrl train` process per (variant, seed) with a fixed run id, a summary row per finished run in
`<out>/runs.jsonl`, and the per-run CSVs read back by variant and seed."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from benchmarks.coach_evidence import teamrl
from benchmarks.common import write_section


def run_and_record(
    out: Path, args, variant: str, seed: int, run_id: str, overrides: list[str], write: Callable[[Path], None]
) -> None:
    """Train run `run_id` (`args.preset`, under `args.runs_dir`) with the variant's `overrides` and the
    command line's iterations, evaluation interval, seed and --set, or resume it where its folder exists;
    then `write(run folder)` its figures (`out`/<variant>-s<seed>.csv at least) and append its summary row
    (wall time, whether it was resumed, the machine, `args.note`) to `out`/runs.jsonl. A run whose CSV
    exists has ended and is skipped. A failed run stops the script with how to go on."""
    if (csv := out / f"{variant}-s{seed}.csv").exists():
        print(f"{csv.name}: done, skipped", flush=True)
        return
    sets = [*overrides, f"iterations={args.iterations}", f"eval_every={args.eval_every}", f"seed={seed}"]
    sets += args.extra
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


def episode_table(run_dir: Path) -> pd.DataFrame:
    """The run's episodes with their `metrics` as columns (a metric named like a column is the column's)."""
    from infra import store

    eps = store.read_table(run_dir, "episodes")
    m = pd.DataFrame([dict(x) for x in eps["metrics"]], index=eps.index)
    return pd.concat([eps.drop(columns="metrics"), m.drop(columns=[c for c in m if c in eps])], axis=1)


def eval_table(run_dir: Path) -> pd.DataFrame:
    """The run's evaluations, one row per iteration: success and its interval (flows.report.run_table)."""
    from flows.metrics import is_eval
    from flows.report import run_table

    table = run_table(run_dir)
    return table[table["phase"].map(is_eval)].set_index("iteration")


def load_tables(out: Path, kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    """variant -> seed -> the table `<out>/<variant>-s<seed><kind>.csv` (kind: "" per iteration, ".questions", ...)."""
    tables: dict[str, dict[int, pd.DataFrame]] = {}
    for f in sorted(out.glob(f"*-s*{kind}.csv")):
        if m := re.fullmatch(rf"(.+)-s(\d+){re.escape(kind)}\.csv", f.name):
            tables.setdefault(m[1], {})[int(m[2])] = pd.read_csv(f)
    return tables


def wall_minutes(out: Path) -> dict[tuple[str, int], float]:
    """(variant, seed) -> minutes of its `teamrl train` processes (a resumed run: the sum), from runs.jsonl."""
    walls: dict[tuple[str, int], float] = {}
    if (out / "runs.jsonl").exists():
        for line in (out / "runs.jsonl").read_text().splitlines():
            r = json.loads(line)
            walls[(r["variant"], r["seed"])] = walls.get((r["variant"], r["seed"]), 0.0) + r["wall_s"] / 60
    return walls


def parser(
    doc: str,
    *,
    preset: str,
    variants: list[str],
    default: list[str],
    seeds: list[int],
    iterations: int,
    eval_every: int,
    runs_dir: Path,
) -> argparse.ArgumentParser:
    """The options every runner over seeds has; a runner adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--preset", default=preset)
    ap.add_argument("--variants", nargs="+", default=default, choices=variants)
    ap.add_argument("--seeds", type=int, nargs="+", default=seeds)
    ap.add_argument("--iterations", type=int, default=iterations)
    ap.add_argument("--eval-every", type=int, default=eval_every)
    ap.add_argument("--runs-dir", default=str(runs_dir))
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra key=value overrides")
    ap.add_argument("--note", default="", help="recorded with each run, e.g. what else shared the CPUs")
    ap.add_argument("--report", action="store_true", help="print the tables from the recorded CSVs")
    ap.add_argument(
        "--write", action="store_true", help="with --report: replace the section(s) in benchmarks/README.md"
    )
    return ap


def run_all(args: argparse.Namespace, run: Callable[[str, int, argparse.Namespace], None]) -> None:
    """`run` each (variant, seed), seed by seed, so an interrupted sweep has whole seeds."""
    for seed in args.seeds:
        for variant in args.variants:
            run(variant, seed, args)


def cli(
    ap: argparse.ArgumentParser,
    out: Path,
    readme: Path,
    section: str,
    report: Callable[[], str],
    run: Callable[[str, int, argparse.Namespace], None],
) -> None:
    """Run what the command line asks: the report (written to `readme` under `section` with --write, once
    there are runs), or the runs."""
    args = ap.parse_args()
    if args.report:
        text = report()
        print(text)
        if args.write and load_tables(out):
            write_section(readme, section, text)
        return
    run_all(args, run)
