"""A run's record: the small files a sweep writes when a run ends, and all that `teamrl report` reads.

`<records>/<variant>-s<seed>.csv`, one number per row, sorted, with the columns of RECORD_COLUMNS:

    split       heldout (the run's held-out split), train (its training iterations), or the name of a
                problem set of the sweep (played by the final team)
    iteration   the policy iteration (held-out: after that many updates; a problem set: the run's last)
    item        heldout and problem sets: the question's task_id; train: empty
    metric      heldout and problem sets: `success` (1/0, empty where an infrastructure fault hit the
                episode), the pipeline's per-episode metrics, and `group/<group>` = 1 where the pipeline
                groups its problems (Pipeline.group_of: DSBench's dataset, DeepResearch's answer kind);
                train: the iteration's metrics as MLflow logs them (flows/metrics.py: success_rate,
                coach_score/<agent>, stage/task_certificate, ...) but wall-clock ones (`seconds/*`, `*_per_s`),
                and `episodes`
    value       the number

`<records>/<variant>-s<seed>.json`: how it was made (RECORD_VERSION, the sweep, the run's overrides, the
code's commit, the machine, wall time, whether it was resumed, the sweep's note). The CSV holds only what
the computation determines, so an interrupted and resumed sweep writes the same CSV as one that was not;
the CSV is written last, so a CSV that exists belongs to a finished run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd

from flows.metrics import greedy_flags, partition_metrics, update_metrics
from flows.sweep_spec import SweepSpec
from infra import store

RECORD_VERSION = 1
RECORD_COLUMNS = ["split", "iteration", "item", "metric", "value"]
ROOT = Path(__file__).resolve().parents[1]


def record_paths(spec: SweepSpec, variant: str, seed: int) -> tuple[Path, Path]:
    stem = f"{variant}-s{seed}"  # a variant name may hold dots: no with_suffix here
    return spec.records_dir() / f"{stem}.csv", spec.records_dir() / f"{stem}.json"


def question_rows(run_dir: Path, split: str, iteration: int | None = None) -> list[tuple]:
    """(split, iteration, task_id, metric, value) of every greedy held-out episode of the run (at `iteration`
    only, where given): success (NaN where an infrastructure fault hit it) and its per-episode metrics."""
    from pipelines import PIPELINES
    from pipelines.base import Problem

    eps = store.read_table(run_dir, "episodes")
    eps = eps[(eps["phase"] == "eval") & (greedy_flags(eps) == 1.0)]
    rows = []
    for ep in eps.itertuples(index=False):
        it = int(ep.iteration) if iteration is None else iteration
        ok = float(ep.success) if ep.infra_error is None or pd.isna(ep.infra_error) else np.nan
        rows.append((split, it, ep.task_id, "success", ok))
        if group := PIPELINES[ep.pipeline].group_of(Problem(ep.task_id, ep.question, ep.answer)):
            rows.append((split, it, ep.task_id, f"group/{group}", 1.0))
        for k, v in dict(ep.metrics).items():
            if k != "greedy" and isinstance(v, int | float) and k != "success":
                rows.append((split, it, ep.task_id, k, float(v)))
    return rows


def volatile(metric: str) -> bool:
    """Wall-clock figures: they differ between two runs of the same computation, so the record leaves them out."""
    return metric.startswith("seconds/") or metric.endswith("_per_s")


def train_rows(run_dir: Path) -> list[tuple]:
    """(train, iteration, "", metric, value) per training iteration, with `episodes`: the iteration's training
    episodes (rollouts and resamples)."""
    eps = store.read_table(run_dir, "episodes")
    train = eps[(eps["phase"] == "rollout") | eps["phase"].str.startswith("resample")]
    rows = []
    for it in sorted(train["iteration"].unique()):
        m = partition_metrics(run_dir, int(it), "rollout") | update_metrics(run_dir, int(it))
        m["episodes"] = float((train["iteration"] == it).sum())
        rows += [("train", int(it), "", k, float(v)) for k, v in m.items() if not volatile(k)]
    return rows


def run_record(run_dir: Path, problem_sets: dict[str, Path]) -> pd.DataFrame:
    """The record of a finished run (the module docstring); `problem_sets`: set name -> the folder where
    its final team played it (flows/sweep.py)."""
    from flows.evaluate import last_iteration

    rows = question_rows(run_dir, "heldout") + train_rows(run_dir)
    final = last_iteration(run_dir)
    for name, folder in problem_sets.items():
        rows += question_rows(folder, name, iteration=final)
    df = pd.DataFrame(rows, columns=RECORD_COLUMNS)
    return df.sort_values(["split", "iteration", "item", "metric"]).reset_index(drop=True)


def code_version() -> dict[str, str | bool]:
    """The commit of the code that ran, and whether tracked files differed from it."""

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    return {"commit": commit or "unknown", "dirty": bool(commit) and bool(git("status", "--porcelain", "-uno"))}


def machine() -> str:
    cpu = ""
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()}, {os.cpu_count()} cores{', ' + cpu if cpu else ''}"


def provenance(spec: SweepSpec, variant: str, seed: int, wall_s: float, resumed: bool) -> dict:
    return {
        "record_version": RECORD_VERSION,
        "sweep": spec.name,
        "variant": variant,
        "seed": seed,
        "run_id": spec.run_id(variant, seed),
        "base": spec.base,
        "overrides": [*spec.set, *spec.variants[variant]],
        "iterations": spec.run_config(variant, seed).iterations,
        **code_version(),
        "machine": machine(),
        "wall_s": round(wall_s, 1),
        "resumed": resumed,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": spec.note,
    }


def write_record(df: pd.DataFrame, info: dict, csv: Path, meta: Path) -> None:
    """The JSON, then the CSV, each renamed into place (a CSV that exists is whole, and has its JSON)."""
    csv.parent.mkdir(parents=True, exist_ok=True)
    tmp = meta.with_name(f".{meta.name}.tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    tmp.replace(meta)
    tmp = csv.with_name(f".{csv.name}.tmp")
    df.to_csv(tmp, index=False, float_format="%.10g")
    tmp.replace(csv)


def read_record(csv: Path) -> pd.DataFrame:
    """A record CSV, checked against RECORD_COLUMNS and its JSON's version."""
    from infra.errors import UsageError

    df = pd.read_csv(csv, dtype={"item": str}, keep_default_na=False, na_values={"value": [""]})
    if list(df.columns) != RECORD_COLUMNS:
        raise UsageError(f"{csv}: not a run record (columns {list(df.columns)}, expected {RECORD_COLUMNS})")
    meta = csv.with_name(csv.name.removesuffix(".csv") + ".json")
    version = json.loads(meta.read_text()).get("record_version") if meta.exists() else None
    if version != RECORD_VERSION:
        raise UsageError(f"{csv}: record version {version}, this teamrl reads version {RECORD_VERSION}")
    return df
