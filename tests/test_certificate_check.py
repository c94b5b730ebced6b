"""benchmarks/certificate_check.py: episode returns, the interval of a mean over updates that share batches,
and the comparison rows of a real TeamTR run."""

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import certificate_check as cc  # noqa: E402


def test_episode_returns_sum_scores_and_the_kl_shaping():
    actions = pd.DataFrame(
        {
            "episode_id": ["e1", "e1", "e2"],
            "turn": [0, 1, 0],
            "agent": ["a", "b", "a"],
            "logprobs": [[-1.0, -2.0], [-1.0], [-0.5]],
            "ref_logprobs": [[-1.5, -2.0], [-1.0], [-1.0]],
        }
    )
    rewards = pd.DataFrame(
        {"episode_id": ["e1", "e1", "e2"], "turn": [0, 1, 0], "agent": ["a", "b", "a"], "reward": [0.7, None, 0.2]}
    )  # b's action unscored: adds nothing
    got = cc.episode_returns(actions, rewards, beta=0.1, kind="k1")
    # e1: 0.7 - 0.1 * ((-1 + 1.5) + 0 + 0) = 0.65; e2: 0.2 - 0.1 * 0.5 = 0.15
    assert got["e1"] == pytest.approx(0.65) and got["e2"] == pytest.approx(0.15)
    assert cc.episode_returns(actions, rewards, beta=0.0, kind="k1")["e1"] == pytest.approx(0.7)


def test_mean_interval_counts_a_shared_batch_once_with_its_summed_coefficient():
    # two updates in a chain: batch A -> B -> C; B is the next batch of one and the fitted batch of the other
    df = pd.DataFrame(
        {
            "run": ["r", "r"],
            "batch": ["A", "B"],
            "next_batch": ["B", "C"],
            "se_before": [0.1, 0.2],
            "se_after": [0.2, 0.3],
            "dj_hat": [0.5, -0.1],
            "certificate": [0.1, -0.3],
        }
    )
    mean, half = cc.mean_interval(df, "certificate")
    assert mean == pytest.approx(((0.5 - 0.1) + (-0.1 + 0.3)) / 2)
    # coefficients: A -1/2, B +1/2 - 1/2 = 0, C +1/2 -> var = (0.1^2 + 0.3^2) / 4
    assert half == pytest.approx(cc.Z95_TWO_SIDED * math.sqrt((0.01 + 0.09) / 4))


@pytest.mark.slow
def test_comparisons_of_a_teamtr_run(teamtr_run):
    from infra import store

    _, run_dir = teamtr_run
    df = pd.DataFrame(cc.comparisons(str(run_dir)))
    updates = store.read_table(run_dir, "updates")
    certified = updates.dropna(subset=["certificate"])
    # the last update of the last iteration has no later batch; the stage of iteration 2 no next rollout
    assert set(df[df["kind"] == "update"]["iteration"]) == {1, 2}
    assert len(df[df["kind"] == "stage"]) == 1 and df[df["kind"] == "stage"]["iteration"].iloc[0] == 1
    row = df[df["kind"] == "update"].iloc[0]
    assert row["certificate"] in set(certified["certificate"])
    assert row["dj_hat"] == pytest.approx(row["j_after"] - row["j_before"])
    # J_hat of the first batch, recomputed from the tables
    it, phase = row["batch"].split("/")
    acts = store.load_actions(run_dir, int(it), phase)
    adv = store.read_table(run_dir, "advantages", int(it), phase).set_index(["episode_id", "turn", "agent"])
    per = {}
    for a in acts.to_dict("records"):
        r = adv.loc[(a["episode_id"], a["turn"], a["agent"]), "reward"]
        per[a["episode_id"]] = per.get(a["episode_id"], 0.0) + (0.0 if pd.isna(r) else r)  # the task return
    assert row["j_before"] == pytest.approx(np.mean(list(per.values())), abs=1e-9)
    assert cc.summary(df)[2].startswith("| update |")
