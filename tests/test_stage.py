"""The DAG stage abstraction (tasks/stage.py) on a toy stage: skip-if-done, the cache key that exists only
with the partition, the fault point before the last table, and the tables' write order."""

from __future__ import annotations

import pytest
import yaml

from infra import store
from infra.faults import InjectedFault
from tasks.context import RunContext
from tasks.stage import stage


def _update_row(iteration: int, phase: str, agent: str, after: int) -> dict:
    return {
        "run_id": "toy",
        "iteration": iteration,
        "phase": phase,
        "agent": agent,
        "strategy": "joint",
        "kl": None,
        "surrogate_gain": None,
        "penalty": None,
        "certificate": None,
        "loss": 0.5,
        "tokens": 3,
        "seconds": 0.1,
        "version_before": after - 1,
        "version_after": after,
        "skipped": False,
        "reason": "",
        "over_length": 0,
        "grad_norm": 0.3,
        "clip_frac": 0.0,
        "kl_ref": None,
    }


calls: list[tuple] = []


@stage("updates", part=lambda p: p["agent"], returns=lambda out: int(out.read("updates")["version_after"].iloc[0]))
def toy_update(run: RunContext, iteration: int, phase: str, agent: str, version_before: int) -> list[dict]:
    calls.append((iteration, phase, agent))
    return [_update_row(iteration, phase, agent, version_before + 1)]


@stage("actions", "episodes", fault="toy_pair")
def toy_pair(run: RunContext, iteration: int, phase: str) -> dict[str, list[dict]]:
    calls.append((iteration, phase, "pair"))
    return {"actions": [], "episodes": []}


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.delenv("TEAMRL_FAULT", raising=False)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run_id": "toy", "nonce": "n1"}))
    calls.clear()
    with RunContext(tmp_path) as opened:
        yield opened


def test_a_stage_computes_once_and_then_answers_from_the_store(run):
    assert toy_update.fn(run, 1, "rollout", "a", 0) == 1
    assert toy_update.fn(run, 1, "rollout", "a", 0) == 1  # done: not computed again
    assert toy_update.fn(run, 1, "rollout", "b", 4) == 5  # another part of the same partition
    assert calls == [(1, "rollout", "a"), (1, "rollout", "b")]
    df = store.read_table(run.run_dir, "updates", 1, "rollout")
    assert sorted(df["agent"]) == ["a", "b"]
    assert list(store.read_table(run.run_dir, "updates", 1, "rollout", name="b")["version_after"]) == [5]


def test_the_cache_key_exists_only_with_the_partition(run):
    key = toy_update.cache_key_fn
    params = {"run": run, "iteration": 2, "phase": "resample-1", "agent": "a", "version_before": 0}
    assert key(None, params) is None  # never written: Prefect must run it
    toy_update.fn(**params)
    assert key(None, params) == "teamrl:toy:n1:toy_update:2:resample-1:a"
    assert key(None, params | {"agent": "b"}) is None  # per part
    (store.partition_dir(run.run_dir, "updates", 2, "resample-1") / "part-a.parquet").unlink()
    assert key(None, params) is None  # deleted by hand: no stale result is served


def test_a_fault_after_the_work_leaves_the_stage_to_redo(run, monkeypatch):
    monkeypatch.setenv("TEAMRL_FAULT", "toy_pair:1:raise")
    with pytest.raises(InjectedFault):
        toy_pair.fn(run, 1, "rollout")
    # the first table is written, the last (the stage's completion mark) is not
    assert store.partition_exists(run.run_dir, "actions", 1, "rollout", name="all")
    assert not store.partition_exists(run.run_dir, "episodes", 1, "rollout", name="all")
    monkeypatch.delenv("TEAMRL_FAULT")
    assert toy_pair.fn(run, 1, "rollout") == str(store.partition_dir(run.run_dir, "episodes", 1, "rollout"))
    assert calls == [(1, "rollout", "pair")] * 2
    assert store.partition_exists(run.run_dir, "episodes", 1, "rollout", name="all")
