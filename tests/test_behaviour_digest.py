"""The behaviour pin for refactors: two seeded tiny runs (TeamTR on MathChat, with its resamples, trust
region and held-out evaluations; MARS on DeepResearch, with System-1 extraction and GRPO) must write the
same five tables, token ids, log-probs, advantages and losses included, as recorded in
tests/behaviour_digest.json.

A change meant to alter what a run computes (new columns, another float path, a fixed bug) regenerates the
record and says why in its commit:

    TEAMRL_WRITE_DIGEST=1 .venv/bin/python -m pytest tests/test_behaviour_digest.py

The record holds for the versions in constraints.txt, which `make install` and `make test` install: a new
release of torch, transformers or accelerate may round differently, so bumping them can mean regenerating it.

Each run is a `teamrl train` process with one torch thread and its kernels held to AVX2 (`ISA_PIN`), so the
digest depends neither on the thread count nor on the CPU: torch, MKL and oneDNN otherwise pick their kernels by
the instruction set they find (AVX2, AVX-512, AVX-512 with FP16), and each choice rounds differently.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ISA_PIN, harness_api_env, run_in_session

pytestmark = pytest.mark.slow

RECORD = Path(__file__).with_name("behaviour_digest.json")
TABLES = ["episodes", "actions", "coach", "advantages", "updates"]
# wall-clock figures and the run's own name differ between two runs of the same computation
VOLATILE = {"run_id", "latency_s", "seconds"}
RUNS = {
    "teamtr-mathchat": [
        "tiny",
        *("algorithm.strategy=teamtr", "algorithm.kl_delta=0.05", "algorithm.order=random", "seed=1"),
    ],
    "mars-deepresearch": ["deepresearch-tiny", "iterations=1", "evaluate=false", "seed=1"],
}


def canonical(value):
    """A JSON-able form of one cell that keeps every digit: floats by repr, arrays as lists, maps as pairs."""
    if isinstance(value, np.ndarray):
        return [canonical(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return "nan" if value != value else repr(value)
    return value


def table_digest(run_dir: Path, table: str) -> dict:
    """Rows and SHA-256 of one table, its rows in key order and its columns by name."""
    from infra import store

    df = store.read_table(run_dir, table)
    df = df[sorted(c for c in df.columns if c not in VOLATILE)]
    keys = [c for c in ("iteration", "phase", "episode_id", "turn", "agent") if c in df]
    h = hashlib.sha256()
    for row in df.sort_values(keys).to_dict("records"):
        h.update(json.dumps({k: canonical(v) for k, v in row.items()}, sort_keys=True).encode())
    return {"rows": len(df), "sha256": h.hexdigest()}


def run_digest(name: str, tmp_path: Path) -> dict:
    preset, *sets = RUNS[name]
    args = [sys.executable, "-m", "flows.cli", "train", preset, "--set", f"run.dir={tmp_path}", "--set", "run.id=pin"]
    args += [x for kv in (*sets, "engines.threads=1") for x in ("--set", kv)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TEAMRL_PROGRESS": "0", **ISA_PIN}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), **harness_api_env()}
    env.pop("TEAMRL_FAULT", None)
    rc, out = run_in_session(args, env, tmp_path / "train.log")
    assert rc == 0, out[-3000:]
    return {t: table_digest(tmp_path / "pin", t) for t in TABLES}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_seeded_run_writes_the_recorded_tables(name, prefect_harness, tmp_path):
    import torch

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the recorded digest was computed with AVX2 kernels, which this CPU lacks")
    got = run_digest(name, tmp_path)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if os.environ.get("TEAMRL_WRITE_DIGEST") == "1":
        record[name] = got
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return
    assert name in record, f"no digest recorded for {name}: run with TEAMRL_WRITE_DIGEST=1 once"
    changed = {t: (record[name][t], got[t]) for t in TABLES if record[name].get(t) != got[t]}
    assert not changed, (
        f"{name}: tables differ from the recorded run (recorded, now): {changed}; the record holds for the "
        "versions in constraints.txt (check `pip freeze` against it)"
    )
