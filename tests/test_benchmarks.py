"""`make bench`'s plumbing and the formulas its figures rest on, on small inputs (no timing is asserted:
the benchmarks report speed, the tests check what they count)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import run_all
from benchmarks.common import Section, Target


def test_targets_and_tables_render():
    assert Target("a", 0.8, at_most=0.8).met and not Target("a", 0.81, at_most=0.8).met
    assert Target("b", 2.0, at_least=2.0).met and not Target("b", 1.9, at_least=2.0).met
    md = Section(
        "T",
        "cmd",
        rows=[{"x": 1, "y": 0.123456}, {"x": 2, "y": None}, {"z": "s"}],
        targets=[Target("r", 1.5, at_most=1.05)],
        notes=["n"],
    ).markdown()
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
    child = subprocess.Popen(
        [sys.executable, "-c", "x = bytearray(200 * 2**20); print(flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child.stdout.readline()  # the child holds its 200 MiB now
        assert tree_rss(me) > alone + 150 * 2**20
    finally:
        child.kill()
        child.wait()
    assert tree_rss(me) < alone + 150 * 2**20


def test_run_all_writes_results_and_reports_a_failing_benchmark(tmp_path, monkeypatch):
    real = run_all.importlib.import_module

    def fake(name, package=None):  # patched on importlib itself, so every import in the run comes through here
        if name == "benchmarks.bench_trl":
            raise ModuleNotFoundError("No module named 'trl'")
        return real(name, package)

    monkeypatch.setattr(run_all.importlib, "import_module", fake)
    out = tmp_path / "RESULTS.md"
    monkeypatch.setattr(sys, "argv", ["run_all", "--quick", "--only", "trl", "store", "--out", str(out)])
    run_all.main()
    text = out.read_text()
    assert "## trl: FAILED" in text and "No module named 'trl'" in text
    assert "## Trajectory store: Parquet partitions vs JSONL dumps" in text and "Parquet / JSONL bytes" in text
    assert "Machine at the start: " in text and "load average" in text and "--only trl store" in text

    # a later --only run rewrites its own benchmark (dropping its earlier failure) and keeps the others' figures
    fixed = Section(title="TRL step", command="c", notes=["now it runs"])
    monkeypatch.setattr(run_all, "run_one", lambda name, quick: (fixed, 0.0))
    monkeypatch.setattr(sys, "argv", ["run_all", "--only", "trl", "--out", str(out)])
    run_all.main()
    merged = out.read_text()
    assert "## trl: FAILED" not in merged and "No module named 'trl'" not in merged
    assert "## TRL step" in merged and "now it runs" in merged
    assert "by `.venv/bin/python -m benchmarks.run_all --only trl`" in merged
    store = text[text.index("## Trajectory store") :]
    assert store in merged and merged.startswith(text[: text.index("## trl: FAILED")])


@pytest.mark.slow
def test_orchestration_benchmark_runs_both_ways_on_the_same_work():
    """One tiny iteration through `train_iteration` (Prefect, MLflow) and through `iteration_stages` as plain calls;
    the benchmark itself checks both wrote the same partitions and tokens."""
    from benchmarks import bench_orchestration

    s = bench_orchestration.run(quick=True)
    assert [r["way"] for r in s.rows] == ["Prefect flow + store + MLflow", "plain loop of the task functions"]
    assert all(r["update"] > 0 and r["collect_rollouts"] > 0 for r in s.rows) and s.targets[0].ratio > 0
    # every stage with a bar (collect, each update that had scored actions to train on) publishes it at least
    # once, at its end; a stage that outlasts PUBLISH_EVERY_S publishes more (tests/test_progress.py)
    calls = [re.search(r"(\d+) progress-artifact calls \(for (\d+) stages with a bar\)", n) for n in s.notes]
    calls = [m for m in calls if m]
    assert calls and int(calls[0][1]) >= int(calls[0][2]) >= 1, s.notes
    traced = [
        re.search(r"MLflow traces \(`run.traces: sample`, (\d+) episodes an iteration.* wrote them in ([\d.]+) s", n)
        for n in s.notes
    ]
    traced = [m for m in traced if m]
    assert traced and int(traced[0][1]) >= 1 and float(traced[0][2]) > 0, s.notes  # tiny's episodes, written


@pytest.mark.slow
def test_trl_benchmark_steps_both_trainers():
    if not os.environ.get("TEAMRL_REQUIRE_TRL"):  # CI requires it: `make test` installs the bench extra
        pytest.importorskip("trl", reason="TRL (the bench extra) is not installed: pip install -e '.[bench]'")
    from benchmarks import bench_trl

    s = bench_trl.run(quick=True)
    ours, theirs = s.rows
    assert ours["trainer"] == "teamrl" and theirs["trainer"].startswith("TRL ")
    assert ours["completion tokens / step"] > 0 and theirs["completion tokens / step"] > 0


@pytest.mark.slow
def test_coach_load_counts_one_call_per_action_with_its_chat(trained_run):
    """benchmarks/coach_load.py on the tiny run: one call per action of each training partition, both
    answer modes, each prompt its chat's tokens (the answer-blind request says so, so it is longer)."""
    from benchmarks.coach_load import load
    from infra import store

    _, run_dir = trained_run
    df = load(str(run_dir)).set_index(["iteration", "phase", "ground_truth"])
    acts = store.read_table(run_dir, "actions")
    acts = acts[acts["phase"] == "rollout"].groupby("iteration").size()
    assert sorted(df.index.get_level_values("iteration").unique()) == [1, 2]
    for it, n in acts.items():
        seen, blind = df.loc[(it, "rollout", True)], df.loc[(it, "rollout", False)]
        assert seen["calls"] == blind["calls"] == n
        assert 0 < seen["prompt_tokens_mean"] < blind["prompt_tokens_mean"] <= blind["prompt_tokens_max"]
        assert seen["prompt_tokens"] == pytest.approx(seen["prompt_tokens_mean"] * n)


@pytest.mark.slow
def test_ranks_benchmark_times_both_ways_and_the_start():
    import torch

    from benchmarks import bench_ranks

    threads = torch.get_num_threads()
    s = bench_ranks.run(quick=True)
    assert torch.get_num_threads() == threads  # later in-process runs keep the session's float path
    assert [r["ranks x threads"] for r in s.rows] == ["1 x 2", "2 x 1", "2 x 1, start only"]
    assert all(r["s / update"] > 0 for r in s.rows) and s.rows[0]["trained tokens"] == s.rows[1]["trained tokens"] > 0
    assert "2 ranks / 1 rank, time of one update" in s.notes[0]


@pytest.mark.slow
def test_coach_serving_benchmark_sends_the_same_chats_to_both_servers():
    from benchmarks import bench_coach_serving

    s = bench_coach_serving.run(quick=True)
    assert [r["server"] for r in s.rows] == ["one at a time", "continuous batching"]
    assert all(
        r["requests at once"] == 4 and 0 < r["reply tokens"] <= 4 * 16 and r["median wall s"] > 0 for r in s.rows
    )
    assert s.notes[0].startswith("continuous batching / one at a time, median wall: ")
    assert re.fullmatch(r"wall s of each round .*: one at a time [\d.]+; continuous batching [\d.]+", s.notes[1])
    assert re.fullmatch(r"replies identical both ways: [0-4] of 4 .*", s.notes[2])


@pytest.mark.slow
def test_gpu_probe_runs_its_smoke_shape_on_the_cpu(tmp_path, monkeypatch):
    """benchmarks/gpu_probe.py at `--shape smoke`: the MathChat turn order through the hf engine (each
    agent's prompts carry the turns before), one update per agent and one full-weight update, written out."""
    import json

    from benchmarks import gpu_probe

    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["gpu_probe", "--shape", "smoke", "--questions", "2", "--episodes", "2", "--full"]
    monkeypatch.setattr(sys, "argv", argv)
    gpu_probe.main()
    out = json.loads((tmp_path / "gpu_probe.json").read_text())
    gen = out["generation"]
    assert [g["stage"] for g in gen] == ["generate solver", "generate executor", "generate verifier"]
    assert all(g["prompts"] == 4 and 0 < g["new_tokens"] <= 4 * b for g, b in zip(gen, (128, 256, 32)))
    assert gen[0]["mean_prompt_tokens"] < gen[1]["mean_prompt_tokens"] < gen[2]["mean_prompt_tokens"]
    ups = [*out["update_lora"], out["update_full"]]
    assert [u["agent"] for u in ups] == ["solver", "executor", "verifier", "solver"]
    assert all(not u["skipped"] and u["samples"] == 4 and u["trained_tokens"] > 0 for u in ups)
    assert out["base_params"] > 0 and out["matmul_peak_tflops"] is None


def test_model_flop_utilisation_by_hand():
    from benchmarks.gpu_probe import mfu

    assert mfu(4 * 10**9, 1000, 8.0) == 0.5  # 4e9 flops a token x 1000 tokens/s = 4 TFLOP/s of a peak of 8
    assert mfu(6 * 3759331840, 7952.3, 801.5) == 0.224  # the H200 probe's full-weight update row


@pytest.mark.slow
def test_decode_check_times_each_way_on_the_cpu(tmp_path):
    import json
    import subprocess

    env = os.environ | {"OUT": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "benchmarks/decode_check.py", "smoke"], env=env, check=True, capture_output=True)
    res = json.loads((tmp_path / "decode_check.json").read_text())
    assert len(res["ms_per_decode_step"]) == 4 and all(v > 0 for v in res["ms_per_decode_step"].values())


@pytest.mark.slow
def test_update_direction_rescores_the_actions_as_they_were_sampled(trained_run):
    from benchmarks import update_direction
    from infra import store

    _, run_dir = trained_run
    rows = update_direction.scored_actions(Path(run_dir), 1)
    adv = store.read_table(run_dir, "advantages")
    signal = sum(1 for a, it in zip(adv["advantages"], adv["iteration"]) if it == 1 and np.mean(a) != 0)
    assert len(rows) == signal > 0
    out = update_direction.direction(Path(run_dir), 1)
    assert set(out["role"]) == set(rows["agent"])
    assert (out["n_pos"] + out["n_neg"]).sum() == len(rows)
    assert (out["max_gap"] < 1e-4).all()  # before the update, the logged log-probs are recomputed
    assert (out["change_pos"].fillna(0) != 0).any() or (out["change_neg"].fillna(0) != 0).any()  # it moved
    assert update_direction.SECTION in update_direction.table(Path(run_dir), [out])
