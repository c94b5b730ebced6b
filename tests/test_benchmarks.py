"""`make bench`'s plumbing and the formulas its figures rest on, on small inputs (no timing is asserted:
the benchmarks report speed, the tests check what they count)."""
from __future__ import annotations

import os
import sys

import pytest

from benchmarks import run_all
from benchmarks.common import Section, Target


def test_targets_and_tables_render():
    assert Target("a", 0.8, at_most=0.8).met and not Target("a", 0.81, at_most=0.8).met
    assert Target("b", 2.0, at_least=2.0).met and not Target("b", 1.9, at_least=2.0).met
    md = Section("T", "cmd", rows=[{"x": 1, "y": 0.123456}, {"x": 2, "y": None}, {"z": "s"}],
                 targets=[Target("r", 1.5, at_most=1.05)], notes=["n"]).markdown()
    assert "| x | y |" in md and "| 1 | 0.1235 |" in md and "| 2 |  |" in md and "| z |" in md  # two tables
    assert "**r: 1.5** (target <= 1.05: NOT met)" in md and "- n" in md


def test_linear_weights_count_the_tiny_models_matmuls():
    from benchmarks.bench_generation import linear_weights
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    policy = TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a"], seed=0)
    body, head = linear_weights(policy.model)
    per_layer = 4 * 256 * 256 + 3 * 256 * 688  # q, k, v, o + gate, up, down; LoRA adapters not counted
    assert body == 4 * per_layer and head == len(policy.tokenizer) * 256


def test_prompt_sharing_times_both_ways():
    from benchmarks.bench_generation import _policy, prompt_sharing

    row = prompt_sharing(_policy("tiny"), prompt_len=12, resp_len=4, group=3, repeats=1)
    assert row["micro-batch"] == "3 x (12-token prompt + 4-token response)"
    assert row["prompt shared (s)"] > 0 and row["prompt per sample (s)"] > 0 and row["shared / per sample"] > 0


def test_adapter_folding_times_both_ways():
    from benchmarks.bench_generation import _policy, adapter_folding

    row = adapter_folding(_policy("tiny"), [[1, 5, 9], [1, 7]], max_new=3, repeats=1)
    assert row["generation"] == "2 prompts x 3 tokens"
    assert row["adapter folded (s)"] > 0 and row["adapter on the side (s)"] > 0 and row["folded / on the side"] > 0


def test_packing_never_beats_the_lower_bound():
    from benchmarks.bench_binpack import _pipeline, packing
    from infra.models import ModelConfig, load_tokenizer

    rows, worst = packing(load_tokenizer(ModelConfig(name="tiny")), _pipeline(), 10)
    assert len(rows) == 6 and all(r["bins (System-1 calls)"] >= r["lower bound"] > 0 for r in rows)
    assert worst == max(r["bins / bound"] for r in rows) >= 1.0


def test_tree_rss_counts_the_children():
    import subprocess

    import psutil

    from benchmarks.bench_memory import tree_rss

    me = psutil.Process(os.getpid())
    alone = tree_rss(me)
    child = subprocess.Popen([sys.executable, "-c", "x = bytearray(200 * 2**20); print(flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()  # the child holds its 200 MiB now
        assert tree_rss(me) > alone + 150 * 2**20
    finally:
        child.kill()
        child.wait()
    assert tree_rss(me) < alone + 150 * 2**20


def test_run_all_writes_results_and_reports_a_failing_benchmark(tmp_path, monkeypatch):
    real = run_all.importlib.import_module

    def fake(name):
        if name == "benchmarks.bench_trl":
            raise ModuleNotFoundError("No module named 'trl'")
        return real(name)

    monkeypatch.setattr(run_all.importlib, "import_module", fake)
    out = tmp_path / "RESULTS.md"
    monkeypatch.setattr(sys, "argv", ["run_all", "--quick", "--only", "trl", "store", "--out", str(out)])
    run_all.main()
    text = out.read_text()
    assert "## trl: FAILED" in text and "No module named 'trl'" in text
    assert "## Trajectory store: Parquet partitions vs JSONL dumps" in text and "Parquet / JSONL bytes" in text
    assert "Machine at the start: " in text and "load average" in text and "--only trl store" in text


@pytest.mark.slow
def test_orchestration_benchmark_runs_both_ways_on_the_same_work():
    """One tiny iteration through `train_iteration` (Prefect, MLflow) and through `iteration(plain=True)`;
    the benchmark itself checks both wrote the same partitions and tokens."""
    from benchmarks import bench_orchestration

    s = bench_orchestration.run(quick=True)
    assert [r["way"] for r in s.rows] == ["Prefect flow + store + MLflow", "plain loop of the task functions"]
    assert all(r["update"] > 0 and r["collect_rollouts"] > 0 for r in s.rows) and s.targets[0].ratio > 0
    # each short stage (collect, one update per agent) costs one progress-artifact call, born at 100%
    assert any("4 progress-artifact calls" in n for n in s.notes)


@pytest.mark.slow
def test_trl_benchmark_steps_both_trainers():
    if not os.environ.get("TEAMRL_REQUIRE_TRL"):  # CI requires it: `make test` installs the bench extra
        pytest.importorskip("trl", reason="TRL (the bench extra) is not installed: pip install -e '.[bench]'")
    from benchmarks import bench_trl

    s = bench_trl.run(quick=True)
    ours, theirs = s.rows
    assert ours["trainer"] == "teamrl" and theirs["trainer"].startswith("TRL ")
    assert ours["completion tokens / step"] > 0 and theirs["completion tokens / step"] > 0
