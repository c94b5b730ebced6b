"""benchmarks/dsbench.py: the figures of a real DSBench run against its own tables, and the report's aggregation
over seeds against hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import dsbench  # noqa: E402


@pytest.mark.slow
def test_figures_of_a_tiny_run_match_its_tables(dsbench_run):
    from infra import store

    run_dir = Path(dsbench_run)
    eps = store.read_table(run_dir, "episodes")
    eps = eps[eps["infra_error"].isna()]
    metrics = [dict(m) for m in eps["metrics"]]
    table = dsbench.per_iteration(run_dir).set_index("iteration")
    held = dsbench.tasks(run_dir)

    for it in (0, 1):  # evaluated before and after the one iteration
        ev = [(e, m) for e, m in zip(eps.itertuples(), metrics) if e.iteration == it and e.phase == "eval"]
        ev = [(e, m) for e, m in ev if m["greedy"] == 1.0]
        assert table.loc[it, "heldout_success"] == pytest.approx(np.mean([float(e.success) for e, _ in ev]))
        assert table.loc[it, "heldout_valid"] == pytest.approx(np.mean([m["submission_ok"] for _, m in ev]))
        assert len(held[held["iteration"] == it]) == len(ev)
    ro = [(e, m) for e, m in zip(eps.itertuples(), metrics) if e.iteration == 1 and e.phase == "rollout"]
    assert table.loc[1, "train_success"] == pytest.approx(np.mean([float(e.success) for e, _ in ro]))
    assert table.loc[1, "train_reward"] == pytest.approx(np.mean([e.outcome for e, _ in ro]))
    for a in dsbench.AGENTS:
        assert table.loc[1, f"train_{a}_delivered"] == pytest.approx(np.mean([m[f"{a}_ok"] for _, m in ro]))
    ups = store.read_table(run_dir, "updates")
    assert table.loc[1, "update_s"] == pytest.approx(ups[ups["iteration"] == 1]["seconds"].sum())
    assert np.isnan(table.loc[0, "train_success"])  # iteration 0 only evaluates

    # dsbench-tiny holds out wine and one synthetic table, neither of its training datasets
    assert set(held["dataset"]) <= {"wine", "synthetic_classification_0"}
    assert set(held["kind"]) == {"classification"}
    assert held.loc[held["submission_ok"] == 0, "metric"].isna().all()


def test_task_metric_is_the_kinds_and_only_for_a_valid_submission(tmp_path):
    from infra import store
    from tests.test_store import ROWS

    scored = {"greedy": 1.0, "submission_ok": 1.0, **{f"{a}_ok": 1.0 for a in dsbench.AGENTS}}
    cases = [  # (task, metrics, success)
        ("diabetes-70", scored | {"regression": 1.0, "fair_rmse": 0.7, "rmse": 55.0, "success": 1.0}, True),
        ("iris-71", scored | {"regression": 0.0, "f1": 0.9, "accuracy": 0.95, "success": 1.0}, True),
        ("wine-72", scored | {"regression": 0.0, "submission_ok": 0.0, "success": 0.0}, False),
    ]
    eps = [
        dict(ROWS["episodes"], episode_id=f"e{i}", task_id=t, iteration=0, phase="eval", metrics=m, success=ok)
        for i, (t, m, ok) in enumerate(cases)
    ]
    eps.append(dict(eps[0], episode_id="e3", infra_error="scorer: failed"))  # outcome unknown: left out
    store.write_partition(tmp_path, "episodes", 0, "eval", eps)
    t = dsbench.tasks(tmp_path).set_index("task_id")
    assert list(t.index) == ["diabetes-70", "iris-71", "wine-72"]
    assert list(t["dataset"]) == ["diabetes", "iris", "wine"]
    assert list(t["kind"]) == ["regression", "classification", "classification"]
    assert t.loc["diabetes-70", "metric"] == 0.7 and t.loc["iris-71", "metric"] == 0.9
    assert np.isnan(t.loc["wine-72", "metric"]) and list(t["success"]) == [1.0, 1.0, 0.0]


def _tasks(success0: list[int], success1: list[int], datasets: list[str]) -> pd.DataFrame:
    # every task a classification one; a valid submission wherever it succeeded, macro F1 0.5 + 0.5 * success
    rows = []
    for it, succ in ((0, success0), (6, success1)):
        for i, (s, d) in enumerate(zip(succ, datasets)):
            rows.append((it, f"{d}-{i}", d, "classification", s, s, 1, s, 1, 0.5 + 0.5 * s if s else np.nan))
    cols = ["iteration", "task_id", "dataset", "kind", "success", "submission_ok"]
    cols += ["data_engineer_ok", "modeler_ok", "analyst_ok", "metric"]
    return pd.DataFrame(rows, columns=cols)


def test_report_over_two_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(dsbench, "OUT", tmp_path)
    datasets = ["digits", "digits", "synthetic_classification_0", "synthetic_classification_0"]
    # seed 0: 1 of 4 -> 3 of 4 (gain 0.5); seed 1: 2 of 4 -> 2 of 4 (gain 0)
    for seed, (s0, s1) in enumerate([([1, 0, 0, 0], [1, 1, 1, 0]), ([1, 1, 0, 0], [1, 0, 1, 0])]):
        _tasks(s0, s1, datasets).to_csv(tmp_path / f"unseen-s{seed}.tasks.csv", index=False)
        pd.DataFrame(
            [
                {"iteration": 0, "heldout_success": np.mean(s0)},
                {"iteration": 1, "train_success": 0.25 * (seed + 1)},
                {"iteration": 6, "train_success": 0.5 + 0.25 * seed, "heldout_success": np.mean(s1)},
            ]
        ).to_csv(tmp_path / f"unseen-s{seed}.csv", index=False)
    lines = dsbench.report().splitlines()
    (row,) = [x for x in lines if x.startswith("| unseen | 0, 1 |")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # success means 0.25 and 0.5 before, 0.75 and 0.5 after; gain (0.5 + 0) / 2
    assert cells[2] == "0.38 ± 0.18 -> 0.62 ± 0.18"
    assert cells[3].startswith("+0.25 [")
    assert cells[4] == "0.38 ± 0.18 -> 0.62 ± 0.18"  # valid submissions follow success here
    assert cells[5] == "0.38 ± 0.18 -> 0.62 ± 0.18"  # training: 0.25, 0.5 -> 0.5, 0.75
    assert cells[6] == "-"  # no runs.jsonl row
    (digits,) = [x for x in lines if x.startswith("| unseen | digits |")]
    # digits: seed 0 0.5 -> 1.0, seed 1 1.0 -> 0.5; macro F1 over the valid ones: 1.0 each time
    assert "| 2 | 0.75 ± 0.35 -> 0.75 ± 0.35 | macro F1 1.00 ± 0.00 -> 1.00 ± 0.00 |" in digits
    (synth,) = [x for x in lines if x.startswith("| unseen | synthetic_classification_0 |")]
    # seed 0: 0 -> 0.5, seed 1: 0 -> 0.5; no valid submission before: no metric
    assert "| 0.00 ± 0.00 -> 0.50 ± 0.00 | macro F1 - -> 1.00 ± 0.00 |" in synth
