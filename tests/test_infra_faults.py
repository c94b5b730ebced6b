"""Infrastructure faults are not agent faults (infra/retry.py): a sandbox that will not start, a tool
backend or a scorer that raises are retried, then recorded; the episode they hit gets no score and no
gradient, the agents are never told their code failed, and too many of them stop the run."""

import errno
from pathlib import Path

import pandas as pd
import pytest

from infra import retry, store
from infra.retry import InfraFault, InfraFaultsExceeded, infra_share_check, with_retries
from infra.sandbox_types import INFRA_PREFIX
from tests.conftest import tiny_config


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(retry, "sleep", lambda s: None)


def test_with_retries_returns_once_the_backend_recovers():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("index offline")
        return "hits"

    assert with_retries(flaky, "tool", "search", retries=3) == "hits" and len(calls) == 3


def test_with_retries_raises_an_infra_fault_naming_the_cause():
    calls = []

    def broken():
        calls.append(1)
        raise ConnectionError("index offline")

    with pytest.raises(InfraFault, match="search failed: ConnectionError: index offline") as e:
        with_retries(broken, "tool", "search", retries=2)
    assert e.value.kind == "tool" and len(calls) == 3


def test_infra_share_check():
    infra_share_check(1, 10, 0.1, "here", "sandbox: x")  # exactly at the limit: go on
    with pytest.raises(InfraFaultsExceeded, match=r"here: 2 of 10 actions \(20%\).*first: sandbox: x"):
        infra_share_check(2, 10, 0.1, "here", "sandbox: x")
    infra_share_check(0, 0, 0.0, "empty", None)


def _fail_marked_programs(monkeypatch):
    """The executor writes `print(n)` programs; those of odd episodes carry FAIL, and the sandbox cannot
    spawn them (EAGAIN, as when a uid's process quota is used up). Returns the spawn attempts per program."""
    import pipelines.mathchat as mc
    from infra import sandbox

    count, attempts = iter(range(10**6)), {}
    monkeypatch.setattr(
        mc, "extract_code", lambda text: (lambda n: f"print({n})" + ("  # FAIL" if n % 2 else ""))(next(count))
    )
    real = sandbox.subprocess.Popen

    def popen(argv, *a, **kw):
        code = Path(argv[-1]).read_text() if argv[-1].endswith(".py") else ""
        attempts[code] = attempts.get(code, 0) + 1
        if "FAIL" in code:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(argv, *a, **kw)

    monkeypatch.setattr(sandbox.subprocess, "Popen", popen)
    return attempts


@pytest.mark.slow
def test_sandbox_and_scorer_faults_leave_their_episodes_unscored(prefect_harness, tmp_path, monkeypatch):
    from flows.metrics import partition_metrics
    from flows.train import train
    from pipelines.mathchat import MathChat

    attempts = _fail_marked_programs(monkeypatch)
    real_rubric, crashed = MathChat.rubric, "rollout-0002-00"

    def rubric(self, e, ground_truth):
        if e.episode_id == crashed:
            raise KeyError("a scorer bug")
        return real_rubric(self, e, ground_truth)

    monkeypatch.setattr(MathChat, "rubric", rubric)
    run = train(
        config=tiny_config(
            tmp_path,
            "run.id=faults",
            "iterations=1",
            "evaluate=false",
            "rollout.max_infra_share=0.9",
            "pipeline.sandbox.retry_backoff_s=0",
        )
    )
    acts = store.load_actions(run, 1, "rollout").set_index(["episode_id", "turn"])
    eps = store.read_table(run, "episodes", 1, "rollout").set_index("episode_id")
    ex = acts.xs(1, level="turn")
    failed = set(ex.index[ex["tool_input"].str.contains("FAIL")])
    assert failed and len(failed) < len(eps) and crashed not in failed
    # retried: the first try and sandbox.start_retries (3) more, then recorded
    assert {attempts[c] for c in ex.loc[sorted(failed), "tool_input"]} == {4}
    for eid in failed:
        assert ex.loc[eid, "infra_error"].startswith("sandbox: spawn failed: [Errno 11]")
        assert ex.loc[eid, "tool_output"].startswith(INFRA_PREFIX)
        verifier_saw = acts.loc[(eid, 2), "prompt_text"]  # told the program never ran, not that it failed
        assert INFRA_PREFIX in verifier_saw and "ERROR" not in verifier_saw
        assert eps.loc[eid, "infra_error"].startswith("sandbox:") and dict(eps.loc[eid, "metrics"])["infra_error"] == 1
    assert pd.isna(eps.loc[crashed, "infra_error"])  # its programs ran; its scorer failed later
    for eid, g in acts.groupby(level="episode_id"):
        if eid in failed or eid == crashed:
            kind = "infra_sandbox" if eid in failed else "infra_scorer"
            assert g["score"].isna().all() and (g["status"] == "error").all() and (g["error_kind"] == kind).all()
            assert (g["weight"] == 0).all() and all(sum(m) == 0 for m in g["loss_mask"])
            assert g["reward"].isna().all()
        else:
            ok = g["status"] == "ok"  # or `skipped`: a verifier with nothing to report is not scored
            assert (ok | (g["status"] == "skipped")).all() and (g["score"].notna() == ok).all()
            assert (g["weight"] == ok.astype(int)).all()
    m = partition_metrics(run, 1, "rollout")
    assert m["infra_error/sandbox"] == len(failed) and m["infra_error/tool"] == 0
    assert m["coach_error/infra_sandbox"] == 3 * len(failed) and m["coach_error/infra_scorer"] == 3
    # the update trained only on the clean episodes' scored actions
    up = store.read_table(run, "updates", 1)
    clean = acts[~acts.index.get_level_values("episode_id").isin(failed | {crashed}) & (acts["weight"] > 0)]
    for agent, n in clean.groupby("agent")["response_ids"].apply(lambda c: int(c.map(len).sum())).items():
        assert int(up.loc[up["agent"] == agent, "tokens"].iloc[0]) == n


@pytest.mark.slow
def test_too_many_infra_faults_stop_the_run_and_keep_nothing(prefect_harness, tmp_path, monkeypatch):
    from flows.train import train

    _fail_marked_programs(monkeypatch)
    with pytest.raises(InfraFaultsExceeded, match=r"more than rollout.max_infra_share=0.1 \(first: sandbox: spawn"):
        train(
            config=tiny_config(
                tmp_path, "run.id=stop", "iterations=1", "evaluate=false", "pipeline.sandbox.retry_backoff_s=0"
            )
        )
    assert not (tmp_path / "stop" / "actions").exists() and not (tmp_path / "stop" / "episodes").exists()


def test_a_search_backend_that_raises_is_a_tool_fault(monkeypatch):
    from pipelines.deepresearch import DeepResearch, DeepResearchConfig

    pipe = DeepResearch(DeepResearchConfig(), seed=0)
    calls = []

    def down(*a):
        calls.append(1)
        raise OSError("index file unreadable")

    monkeypatch.setattr(pipe.index, "search", down)
    call = pipe._tool("search", "capital of X", "find the capital")
    assert call.infra_error == "tool: search failed: OSError: index file unreadable" and len(calls) == 4
    assert call.documents[0].startswith(INFRA_PREFIX) and call.purpose == "find the capital"


def test_a_dsbench_scorer_that_raises_leaves_the_episode_unscored(monkeypatch):
    from pipelines.dsbench import DSBench, DSBenchConfig, data
    from tests.test_dsbench import GOOD, ScriptedTeam

    pipe = DSBench(
        DSBenchConfig(datasets=["iris"], train_size=2, eval_size=1, examples=False, scaffold="none", stop=[]), seed=0
    )
    monkeypatch.setattr(data, "score_submission", lambda *a: (_ for _ in ()).throw(MemoryError("scorer OOM")))
    probs = pipe.problems("train")[:1]
    (ep,) = pipe.run_episodes(probs, ["e0"], ["g0"], ScriptedTeam(GOOD))
    assert ep.infra_error == "scorer: scoring " + probs[0].task_id + " failed: MemoryError: scorer OOM"
    assert all(a["infra_error"] is None for a in ep.actions)  # the programs themselves ran


def test_success_counts_only_the_episodes_no_infra_fault_hit(tmp_path):
    from flows.metrics import partition_metrics
    from tests.test_store import ROWS

    def episode(eid, success, fault):
        return dict(
            ROWS["episodes"],
            episode_id=eid,
            success=success,
            infra_error=fault,
            iteration=1,
            phase="eval",
            metrics={"greedy": 1.0},
        )

    eps = [
        episode("e0", True, None),
        episode("e1", False, "sandbox: spawn failed"),
        episode("e2", False, None),
        episode("e3", False, "tool: search failed"),
    ]
    store.write_partition(tmp_path, "episodes", 1, "eval", eps)
    store.write_partition(
        tmp_path,
        "actions",
        1,
        "eval",
        [dict(ROWS["actions"], episode_id=e["episode_id"], iteration=1, phase="eval") for e in eps],
    )
    m = partition_metrics(tmp_path, 1, "eval")
    assert m["success_rate"] == 0.5  # e0 and e2; e1 and e3 measured the host
    assert (m["infra_error/sandbox"], m["infra_error/tool"], m["infra_error/scorer"]) == (1, 1, 0)
