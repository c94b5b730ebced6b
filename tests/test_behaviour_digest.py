"""The behaviour pin for refactors: two seeded tiny runs (TeamTR on MathChat, with its resamples, trust
region and held-out evaluations; MARS on DeepResearch, with System-1 extraction and GRPO) must write the
same five tables, token ids, log-probs, advantages and losses included, as recorded in
tests/behaviour_digest.json: text, ids, counts and flags exactly, each float column within rounding
(FLOAT_RTOL of its magnitude).

A change meant to alter what a run computes (new columns, another float path, a fixed bug) regenerates the
record and says why in its commit:

    TEAMRL_WRITE_DIGEST=1 .venv/bin/python -m pytest tests/test_behaviour_digest.py

The record holds for the versions in constraints.txt, which `make install` and `make test` install: a new
release of torch, transformers or accelerate may round differently, so bumping them can mean regenerating it.

Each run is a `teamrl train` process with one torch thread and its kernels held to AVX2 (`ISA_PIN`), so the
digest depends neither on the thread count nor on the CPU: torch, MKL, oneDNN, numpy and OpenBLAS otherwise pick
their kernels by the instruction set they find (AVX2, AVX-512, AVX-512 with FP16), and each choice rounds
differently. A rounding difference in a sampled token's logits would change the text, so the pin is what keeps
the exact part exact; the float tolerance covers the rest (with torch alone pinned, an AMD AVX2 CPU and an Intel
AVX-512 one wrote the same episodes, actions, coach scores and advantages, and TeamTR updates tables that differed).
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


# a float may move by rounding alone between CPUs whose kernels the pin does not reach: each float column is
# compared by its fingerprint within FLOAT_RTOL of its magnitude, everything else (text, token ids, counts,
# flags, which floats are NaN) by SHA-256
FLOAT_RTOL = 1e-9


def split_cell(value, floats: list[float]):
    """A JSON-able form of one cell with each finite float moved to `floats` and left as the mark "f"."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [split_cell(v, floats) for v in value]
    if isinstance(value, dict):
        return {str(k): split_cell(v, floats) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if not np.isfinite(value):
            return repr(value)
        floats.append(value)
        return "f"
    return value


def fingerprint(values: list[float]) -> list[float]:
    """[count, sum, sum of |x|, sum of x weighted by position]: a change of any value or of their order shows."""
    x = np.asarray(values, np.float64)
    w = np.arange(1, len(x) + 1) / max(len(x), 1)
    return [float(len(x)), float(x.sum()), float(np.abs(x).sum()), float((w * x).sum())]


def table_digest(run_dir: Path, table: str) -> dict:
    """Rows, SHA-256 of the exact cells (rows in key order, columns by name) and each float column's fingerprint."""
    from infra import store

    df = store.read_table(run_dir, table)
    df = df[sorted(c for c in df.columns if c not in VOLATILE)]
    keys = [c for c in store.KEYS if c in df]
    h = hashlib.sha256()
    floats: dict[str, list[float]] = {c: [] for c in df.columns}
    for row in df.sort_values(keys).to_dict("records"):
        h.update(json.dumps({k: split_cell(v, floats[k]) for k, v in row.items()}, sort_keys=True).encode())
    prints = {c: fingerprint(v) for c, v in floats.items() if v}
    return {"rows": len(df), "sha256": h.hexdigest(), "floats": prints}


def differs(recorded: dict, now: dict) -> bool:
    """Whether two digests of one table differ by more than rounding."""
    exact = ("rows", "sha256")
    if [recorded[k] for k in exact] != [now[k] for k in exact] or recorded["floats"].keys() != now["floats"].keys():
        return True
    for col, (n, total, size, weighted) in recorded["floats"].items():
        n2, total2, size2, weighted2 = now["floats"][col]
        tol = FLOAT_RTOL * max(size, size2)
        if n != n2 or abs(total - total2) > tol or abs(size - size2) > tol or abs(weighted - weighted2) > tol:
            return True
    return False


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


def test_a_float_may_round_but_not_change():
    cells = [[0.1, 0.2], [3.0, float("nan")], [-2.5e-9, 1.0]]
    base = fingerprint([x for row in cells for x in row if x == x])
    rounded = fingerprint([0.1 + 1e-17, 0.2, 3.0, -2.5e-9 * (1 + 1e-12), 1.0])
    digest = {"rows": 3, "sha256": "s", "floats": {"x": base}}
    assert not differs(digest, {**digest, "floats": {"x": rounded}})
    for changed in ([0.1, 0.2, 3.0 + 1e-6, -2.5e-9, 1.0], [0.2, 0.1, 3.0, -2.5e-9, 1.0], [0.1, 0.2, 3.0, 1.0]):
        assert differs(digest, {**digest, "floats": {"x": fingerprint(changed)}})
    assert differs(digest, {**digest, "sha256": "t"})
    assert differs(digest, {**digest, "floats": {"y": base}})
    floats: list[float] = []
    assert split_cell(np.array([1.5, np.nan]), floats) == ["f", "nan"] and floats == [1.5]


@pytest.mark.slow
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
    changed = {
        t: (record[name].get(t), got[t]) for t in TABLES if t not in record[name] or differs(record[name][t], got[t])
    }
    assert not changed, (
        f"{name}: tables differ from the recorded run (recorded, now): {changed}; the record holds for the "
        "versions in constraints.txt (check `pip freeze` against it)"
    )
