"""Episodes as MLflow traces (infra/traces.py): the span tree of scripted MathChat, deep-research (System 1
under its System-2 call) and DSBench episodes, the sample spread over outcomes and groups, and a tiny run
whose traces carry every turn and the coach's verdicts, written once however often they are asked for."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_config
from typer.testing import CliRunner

from infra.traces import chosen, episode_tree, sample_episodes


def _episode(**kw) -> dict:
    return {
        "episode_id": "rollout-0000-00",
        "question": "What is 6 * 7?",
        "final_answer": "42",
        "success": True,
        "outcome": 1.0,
        "answer": "42",
        "task_id": "t0",
        "group_id": "rollout-0000",
        "pipeline": "mathchat",
        "infra_error": None,
    } | kw


def _action(turn, agent, response, system=0, tool=None, parent=None, score=None, status="ok", **kw) -> dict:
    return {
        "turn": turn,
        "agent": agent,
        "role": agent,
        "system": system,
        "policy_version": 3,
        "prompt_text": "x" * 3000 + f"<{agent} prompt end>",
        "response_text": response,
        "response_ids": [1] * 5,
        "tool_name": tool[0] if tool else None,
        "tool_input": tool[1] if tool else None,
        "tool_output": tool[2] if tool else None,
        "parent_turn": parent,
        "infra_error": None,
        "score": score,
        "rationale": f"why {agent}",
        "status": status,
        "coach_model": "rubric",
        "advantages": [0.5, 0.5, 0.5, 0.5, 0.5],
        "reward": score,
    } | kw


def _tree(span) -> list:
    """(name, type, children) nested: the shape the UI shows."""
    return [span.name, span.span_type, [_tree(c) for c in span.children]]


def test_a_mathchat_episode_is_a_root_with_a_span_per_turn_and_the_tool_under_its_turn():
    acts = [
        _action(1, "executor", "```python\nprint(6*7)\n```", tool=("python", "print(6*7)", "42"), score=8.0),
        _action(0, "solver", "multiply", score=10.0),
        _action(2, "verifier", "ANSWER: 42", score=None, status="skipped"),
    ]
    root = episode_tree(_episode(), acts)
    assert _tree(root) == [
        "episode rollout-0000-00",
        "AGENT",
        [
            ["solver (turn 0)", "LLM", []],
            ["executor (turn 1)", "LLM", [["python", "TOOL", []]]],
            ["verifier (turn 2)", "LLM", []],
        ],
    ]
    assert root.inputs == {"question": "What is 6 * 7?"} and root.outputs == {"final_answer": "42"}
    assert root.attributes["success"] is True and root.attributes["answer"] == "42"
    solver, executor, verifier = root.children
    assert solver.inputs["prompt_tail"].endswith("<solver prompt end>") and len(solver.inputs["prompt_tail"]) == 2000
    want = {"agent": "solver", "policy_version": 3, "response_tokens": 5, "advantage": 0.5}
    assert {k: solver.attributes[k] for k in want} == want
    assert executor.children[0].inputs == {"input": "print(6*7)"} and executor.children[0].outputs == {"output": "42"}
    assert solver.feedback == {"score": 10.0, "rationale": "why solver", "status": "ok", "coach": "rubric"}
    assert verifier.feedback["score"] is None and verifier.feedback["status"] == "skipped"  # not scored: said so


def test_system1_extractions_sit_under_the_system2_call_that_caused_them():
    acts = [
        _action(0, "system2", "SEARCH: Ada PURPOSE: birth year", system=2, tool=("search", "Ada", "3 documents")),
        _action(1, "system1", "born 1815", system=1, parent=0),
        _action(2, "system1", "no fact here", system=1, parent=0),
        _action(3, "system2", "ANSWER: 1815", system=2),
    ]
    root = episode_tree(_episode(pipeline="deepresearch"), acts)
    assert _tree(root) == [
        "episode rollout-0000-00",
        "AGENT",
        [
            [
                "system2 (turn 0)",
                "LLM",
                [["search", "TOOL", []], ["system1 (turn 1)", "LLM", []], ["system1 (turn 2)", "LLM", []]],
            ],
            ["system2 (turn 3)", "LLM", []],
        ],
    ]
    assert root.children[0].children[1].attributes["system"] == 1


def test_a_dsbench_episode_with_an_unscored_infra_fault_keeps_the_fault_on_its_tool():
    acts = [
        _action(0, "planner", "fit a forest", score=7.0),
        _action(
            1,
            "analyst",
            "```python\n...\n```",
            tool=("python", "...", "sandbox did not start"),
            score=None,
            status="error",
            infra_error="sandbox: no slot",
        ),
    ]
    root = episode_tree(_episode(pipeline="dsbench", success=False, infra_error="sandbox: no slot"), acts)
    tool = root.children[1].children[0]
    assert (
        tool.attributes == {"infra_error": "sandbox: no slot"} and root.attributes["infra_error"] == "sandbox: no slot"
    )
    assert root.children[1].feedback["status"] == "error"


def test_the_sample_spreads_over_outcomes_and_groups_and_is_seeded():
    eps = pd.DataFrame(
        {
            "episode_id": [f"e{i}" for i in range(12)],
            "group_id": [f"g{i // 4}" for i in range(12)],  # 3 groups of 4
            "success": [i in (1, 5) for i in range(12)],  # 2 successes
        }
    )
    picked = sample_episodes(eps, 4, seed=0)
    assert picked == sample_episodes(eps, 4, seed=0) and len(set(picked)) == 4
    rows = eps.set_index("episode_id").loc[picked]
    assert rows["success"].sum() == 2  # both successes, alternating with failures
    assert rows["group_id"].nunique() == 3  # every group before a group twice
    assert sorted(sample_episodes(eps, 50, seed=1)) == sorted(eps["episode_id"])  # more than there are: all


def test_what_each_mode_traces(tmp_path):
    assert chosen(tmp_path, 1, "eval", "sample", 8, 0) is None  # every held-out episode
    assert chosen(tmp_path, 1, "eval-swap-solver", "sample", 8, 0) is None
    assert chosen(tmp_path, 1, "resample-1", "sample", 8, 0) == []  # TeamTR's resamples: with `all` only
    assert chosen(tmp_path, 1, "resample-1", "all", 8, 0) is None
    assert chosen(tmp_path, 1, "rollout", "none", 8, 0) == [] and chosen(tmp_path, 1, "eval", "none", 8, 0) == []


@pytest.mark.slow
def test_a_run_traces_its_episodes_with_the_coach_verdicts_once(prefect_harness, tmp_path):
    import mlflow

    from flows.cli import app
    from flows.inspection import trace_run, traces
    from flows.train import train
    from infra import store

    run_dir = train(config=tiny_config(tmp_path, "run.id=traced", "iterations=1", "run.trace_sample=3"))
    df = traces(run_dir)
    tags = pd.DataFrame(list(df["tags"]))
    counts = tags.groupby(["teamrl.iteration", "teamrl.phase"]).size().to_dict()
    assert counts == {("0", "eval"): 8, ("1", "rollout"): 3, ("1", "eval"): 8}  # held-out all, training a sample
    one = df[(tags["teamrl.phase"] == "rollout").to_numpy()].iloc[0]
    trace = mlflow.get_trace(one["trace_id"])
    names = [s.name for s in trace.data.spans]
    assert names[0].startswith("episode rollout-") and {"solver (turn 0)", "executor (turn 1)"} <= set(names)
    assert "python" in names  # the executor's program and what it printed
    acts = store.load_actions(run_dir, 1, "rollout")
    acts = acts[acts["episode_id"] == one["tags"]["teamrl.episode_id"]]
    verdicts = {a.span_id: a for a in trace.info.assessments if a.name == "coach"}
    by_name = {s.name: s.span_id for s in trace.data.spans}
    for a in acts.itertuples():
        v = verdicts[by_name[f"{a.agent} (turn {a.turn})"]]
        assert v.rationale == a.rationale and v.metadata["status"] == a.status and v.source.source_id == "rubric"
        assert (v.value is None) if pd.isna(a.score) else v.value == pytest.approx(a.score)
    # asked again (a resume, or `teamrl runs trace`): nothing is written twice
    assert trace_run(run_dir, tmp_path, 1) == {(1, "eval"): 0, (1, "rollout"): 0}
    assert sum(trace_run(run_dir, tmp_path, 1, every=True).values()) == 8 - 3  # the rest of the rollouts
    assert len(traces(run_dir)) == 8 + 8 + 8
    episode = one["tags"]["teamrl.episode_id"]
    show = ["runs", "show", "traced", "--dir", str(tmp_path), "-e", episode, "--iteration", "1", "--phase", "rollout"]
    out = CliRunner().invoke(app, show)
    assert out.exit_code == 0 and f"selectedEvaluationId={one['trace_id']}" in out.output, out.output


def _writer_fakes(monkeypatch, release):
    """infra.traces with a writer that waits for `release` before recording each partition it was given."""
    import threading

    import infra.traces

    started, written = threading.Event(), []

    def log_partition(uri, experiment, run_id, run_dir, iteration, phase, episodes):
        started.set()
        assert release.wait(60)
        written.append((iteration, phase, episodes))
        return episodes

    monkeypatch.setattr(infra.traces, "chosen", lambda run_dir, k, phase, mode, sample, seed: [f"{phase}-{k}"])
    monkeypatch.setattr(infra.traces, "log_partition", log_partition)
    return started, written


def _writer_thread():
    import threading

    return next((t for t in threading.enumerate() if t.name == "teamrl-traces"), None)


def test_traces_are_written_beside_the_run_and_its_end_waits_for_them(tmp_path, monkeypatch):
    import threading

    from infra.tracking import Tracker

    (tmp_path / "r").mkdir()
    tracker = Tracker(tmp_path / "r", tmp_path, "exp", None, {})
    release = threading.Event()
    _, written = _writer_fakes(monkeypatch, release)
    assert [tracker.log_traces(tmp_path / "r", k, "rollout", "sample", 8, 0) for k in (1, 2)] == [1, 1]
    assert written == []  # the calls returned while the writer waits: the next stage is not held up
    release.set()
    tracker.finish()
    assert written == [(1, "rollout", ["rollout-1"]), (2, "rollout", ["rollout-2"])] and tracker.trace_seconds > 0
    assert _writer_thread() is None


def test_a_stopped_run_leaves_its_queued_traces_to_the_resume(tmp_path, monkeypatch):
    import threading

    from infra.tracking import Tracker

    (tmp_path / "r").mkdir()
    tracker = Tracker(tmp_path / "r", tmp_path, "exp", None, {})
    release = threading.Event()
    started, written = _writer_fakes(monkeypatch, release)
    for k in (1, 2, 3):
        tracker.log_traces(tmp_path / "r", k, "rollout", "sample", 8, 0)
    assert started.wait(60)  # the writer is inside the first partition
    tracker.finish("KILLED")  # returns without waiting for the writer (Ctrl-C must stop at once)
    writer = _writer_thread()
    release.set()
    writer.join(60)
    assert not writer.is_alive() and written == [(1, "rollout", ["rollout-1"])]  # 2 and 3: the resume's
