"""The trajectory store against JSONL dumps: bytes, write and read seconds, and a filtered read.

    .venv/bin/python -m benchmarks.bench_store [--quick]

Writes the same `actions` rows (1M by default, synthetic but shaped like MathChat's: a 3-agent team,
~100 prompt tokens, ~40 response tokens with their log-probs, the texts) two ways, one iteration at a
time as a training run does:
  - teamrl's store (infra/store.py): one Parquet partition per iteration, `write_partition`;
  - JSONL, one file per iteration (as verl's rollout dumps: a JSON object per line).
Then reads everything back into pandas (`read_table` / `pd.read_json(lines=True)`), and reads one
agent's rows of one iteration: the store opens that partition only; JSONL has to parse the whole
iteration's file before filtering.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import Section, Target, median_seconds

AGENTS = ("solver", "executor", "verifier")


def rows(iteration: int, n: int, seed: int = 0) -> list[dict]:
    """`n` actions rows of one iteration (run keys included)."""
    r = np.random.default_rng([seed, iteration])
    out = []
    for i in range(n):
        p, q = int(r.integers(60, 140)), int(r.integers(10, 70))
        out.append(
            {
                "run_id": "bench",
                "iteration": iteration,
                "phase": "rollout",
                "episode_id": f"e{iteration}-{i // 3}",
                "turn": i % 3,
                "agent": AGENTS[i % 3],
                "role": AGENTS[i % 3],
                "system": 0,
                "policy_version": 1,
                "prompt_text": "Solve: what is 17 * 23 + 4? " * (p // 12),
                "response_text": "17 * 23 = 391 " * (q // 6),
                "prompt_ids": r.integers(0, 49152, p).tolist(),
                "response_ids": r.integers(0, 49152, q).tolist(),
                "logprobs": (-r.exponential(1.0, q)).round(4).tolist(),
                "ref_logprobs": None,
                "tool_name": None,
                "tool_input": None,
                "tool_output": None,
                "parent_turn": None,
                "infra_error": None,
            }
        )
    return out


def _bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _write_jsonl(root: Path, k: int, batch: list[dict]) -> None:
    with open(root / f"actions-{k}.jsonl", "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in batch)


def run(quick: bool = False) -> Section:
    from infra import store

    total, per_iter = (20_000, 5_000) if quick else (1_000_000, 50_000)
    iters = total // per_iter
    tmp = Path(tempfile.mkdtemp(prefix="teamrl-bench-store-"))
    try:
        pq_dir, js_dir = tmp / "run", tmp / "jsonl"
        js_dir.mkdir()
        write = {"parquet": 0.0, "jsonl": 0.0}
        for k in range(1, iters + 1):
            batch = rows(k, per_iter)
            t0 = time.perf_counter()
            store.write_partition(pq_dir, "actions", k, "rollout", batch)
            write["parquet"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            _write_jsonl(js_dir, k, batch)
            write["jsonl"] += time.perf_counter() - t0
        size = {"parquet": _bytes(pq_dir), "jsonl": _bytes(js_dir)}
        # JSONL is parsed file by file and not kept (1M rows of Python lists would not fit beside the
        # other runs); the store's read returns the whole table
        read = {
            "parquet": median_seconds(lambda: store.read_table(pq_dir, "actions"), 1 if quick else 3, warmup=0),
            "jsonl": median_seconds(
                lambda: sum(len(pd.read_json(f, lines=True)) for f in js_dir.glob("*.jsonl")), 1, warmup=0
            ),
        }
        k = iters // 2 + 1

        def pq_one():
            df = store.read_table(pq_dir, "actions", iteration=k, phase="rollout")
            return df[df["agent"] == "executor"]

        def js_one():
            df = pd.read_json(js_dir / f"actions-{k}.jsonl", lines=True)
            return df[df["agent"] == "executor"]

        assert len(pq_one()) == len(js_one()) == len(range(1, per_iter, 3))  # both read the same rows
        one = {"parquet": median_seconds(pq_one, 5), "jsonl": median_seconds(js_one, 5)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = [
        {
            "format": name,
            "rows": total,
            "MB": size[name] / 2**20,
            "write s": write[name],
            "read all s": read[name],
            "read 1 iteration x 1 agent s": one[name],
        }
        for name in ("parquet", "jsonl")
    ]
    return Section(
        title="Trajectory store: Parquet partitions vs JSONL dumps",
        command=f".venv/bin/python -m benchmarks.bench_store{' --quick' if quick else ''}",
        rows=table,
        targets=[
            Target("Parquet / JSONL bytes", size["parquet"] / size["jsonl"], at_most=1.0),
            Target("Parquet / JSONL write seconds", write["parquet"] / write["jsonl"], at_most=1.0),
            Target("Parquet / JSONL read-all seconds", read["parquet"] / read["jsonl"], at_most=1.0),
            Target("Parquet / JSONL filtered-read seconds", one["parquet"] / one["jsonl"], at_most=1.0),
        ],
        notes=[
            f"{iters} iterations of {per_iter} rows; write seconds include building the Arrow table from the "
            "row dicts (the store's input) and the fsync; reads return pandas DataFrames"
        ],
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20k rows instead of 1M")
    print(run(ap.parse_args().quick).markdown())
