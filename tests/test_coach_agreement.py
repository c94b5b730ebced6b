"""benchmarks/coach_agreement.py's bookkeeping against a local OpenAI-compatible server that always scores 7:
one row per action and mode, rows written as it goes, a rerun scoring only what the CSV lacks, and the
table read from them. The real `transformers serve` coach is tested in test_llm_coach_server.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_coach_faults import server  # noqa: F401 (the fixture)

from benchmarks import coach_agreement as ca

pytestmark = pytest.mark.slow


def test_scores_every_action_in_both_modes_and_resumes(trained_run, server, tmp_path):  # noqa: F811
    _, run_dir = trained_run
    episodes = ca.sample_episodes([str(run_dir)], n_actions=6, seed=0)
    actions = sum(len(e.actions) for _, e in episodes)
    assert len(episodes) == 2 and actions == 6  # every action of whole episodes
    csv = tmp_path / "agreement.csv"

    df = ca.score(episodes, server.url("ok"), "coach", csv, chunk=1)
    assert len(df) == 2 * actions and set(df["mode"]) == {"with answer", "without answer"}
    assert (df["llm"] == 7).all() and (df["status"] == "ok").all()
    assert df.groupby("mode")["agent"].apply(sorted).map(tuple).nunique() == 1  # the same actions in each mode
    asked = server.hits["ok"]
    assert asked == 2 * actions
    # each chunk in both modes before the next: stopped early, the modes hold the same episodes
    order = pd.read_csv(csv).drop_duplicates(["iteration", "episode_id", "mode"])
    modes = ("with answer", "without answer")
    assert list(zip(order["iteration"], order["episode_id"], order["mode"])) == [
        (int(e.actions[0]["iteration"]), e.episode_id, m) for _, e in episodes for m in modes
    ]

    ca.score(episodes, server.url("ok"), "coach", csv)  # all there: nothing asked
    assert server.hits["ok"] == asked
    rows = pd.read_csv(csv)
    first = episodes[0][1].episode_id
    rows[~((rows["mode"] == "without answer") & (rows["episode_id"] == first))].to_csv(csv, index=False)
    df = ca.score(episodes, server.url("ok"), "coach", csv)  # one episode of one mode lost
    assert server.hits["ok"] == asked + len(episodes[0][1].actions)
    assert len(df) == 2 * actions and not df.duplicated(["mode", "run", "iteration", "episode_id", "agent"]).any()

    lines = ca.table(df)
    assert lines[2].startswith(f"| with answer | all | {actions} | 0% | 7×{actions} | 0% |")
    copied = pd.DataFrame(
        {
            "mode": ["with answer", "without answer", "without answer"],
            "rationale": [
                "no PROCESS_SCORE in 0..10 in 2 answer(s); last: The program adds instead of multiplying, so",
                "The task multiplies but the program adds, so it cannot print 92 * 42.\nPROCESS_SCORE: 3",
                "The program adds instead of multiplying.",  # the other mode's example
            ],
        }
    )
    assert ca.echoes(copied).tolist() == [True, True, False]
    assert ca.verdicts(pd.Series([2.0, None, 3.0, 2.0])) == "2×2, 3×1" and ca.verdicts(pd.Series([None])) == "none"

    # the sample frozen into a run folder of its own: the same episodes, and scoring from it asks for nothing
    frozen = ca.freeze(episodes, tmp_path / "sample")
    (folder,) = {r for r, _ in frozen}
    from infra import store

    # the folder holds the sampled episodes and their actions, nothing else
    assert len(store.read_table(folder, "episodes")) == len(episodes)
    assert len(store.read_table(folder, "actions")) == actions
    from tasks.coach_evaluate import load_partition_episodes

    # episode ids repeat across iterations: one id of iteration 1 and another of iteration 2 copy two episodes
    one, two = (load_partition_episodes(str(run_dir), it, "rollout")[k] for it, k in ((1, 0), (2, 1)))
    picked = ca.freeze([(str(run_dir), one), (str(run_dir), two)], tmp_path / "picked")
    kept = store.read_table(picked[0][0], "episodes")
    assert sorted(zip(kept["iteration"], kept["episode_id"])) == [(1, one.episode_id), (2, two.episode_id)]
    assert [e.episode_id for _, e in frozen] == [e.episode_id for _, e in episodes]
    assert [a["response_text"] for _, e in frozen for a in e.actions] == [
        a["response_text"] for _, e in episodes for a in e.actions
    ]
    again = ca.sample_episodes([folder], n_actions=6, seed=0)  # later, from the folder alone
    assert [(e.episode_id, e.outcome) for _, e in again] == [(e.episode_id, e.outcome) for _, e in episodes]
    files = {f: f.stat().st_mtime_ns for f in Path(folder).rglob("*.parquet")}
    refrozen = ca.freeze(again, tmp_path / "sample")  # already there: left as it is
    assert [e.episode_id for _, e in refrozen] == [e.episode_id for _, e in episodes]
    assert {f: f.stat().st_mtime_ns for f in Path(folder).rglob("*.parquet")} == files
    df = ca.score(again, server.url("ok"), "coach", csv)
    assert server.hits["ok"] == asked + len(episodes[0][1].actions) and len(df) == 2 * actions
