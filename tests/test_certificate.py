"""TeamTR's certificate (tasks/certificate.py): its terms against hand-computed values, and the bound
against the exact improvement of small tabular teams (benchmarks/certificate_truth.py), where a violated
bound, or one that never certifies, fails."""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.certificate import Z95, Segment, bound, cluster_se, episode_terms, team_advantages

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import certificate_truth as truth  # noqa: E402
import occupancy_scaling as occ  # noqa: E402


def test_episode_terms_of_the_acting_agent_alone():
    seg = [Segment("a", np.array([1.2, 0.5]), np.array([1.0, 2.0])), Segment("b", np.array([3.0]))]
    x, y = episode_terms(seg, "a", set())
    assert x == pytest.approx(0.2 * 1.0 + (-0.5) * 2.0)  # X = sum (rho - 1) A
    # Y = |rho_1 - 1| (1 - rho_2)_+ + |rho_2 - 1| * 0: b is not changed, so its token counts for nothing
    assert y == pytest.approx(0.2 * 0.5)


def test_episode_terms_with_agents_changed_since_the_batch():
    seg = [
        Segment("c", np.array([2.0, 0.5])),
        Segment("a", np.array([1.2, 0.5]), np.array([1.0, 2.0])),
        Segment("c", np.array([0.6])),
    ]
    x, y = episode_terms(seg, "a", {"c"})
    assert x == pytest.approx(-0.8)  # only a's tokens carry the gain
    # stale before a's tokens: W_1 |2 - 1| + W_2 |0.5 - 1| = 1 * 1 + 2 * 0.5 = 2
    # after a's first token: (1 - 0.5)_+ (a) + (1 - 0.6)_+ (c) = 0.9; after a's second: 0.4
    assert y == pytest.approx(0.2 * (0.9 + 2.0) + 0.5 * (0.4 + 2.0))


def test_cluster_se_and_bound_hand_computed():
    v = np.array([1.0, 3.0, 2.0, 6.0])
    groups = ["g", "g", "h", "h"]
    # mean 3; group sums of deviations: -2, 2; se^2 = 2 / 1 * 8 / 16 = 1
    assert cluster_se(v, groups) == pytest.approx(1.0)
    assert cluster_se(v, ["g"] * 4) == math.inf
    b = bound(v, np.array([0.5, 0.5, 0.5, 0.5]), groups, span=2.0)
    assert (b.gain, b.penalty_occ) == (pytest.approx(3.0), pytest.approx(1.0))
    assert b.penalty_est == pytest.approx(Z95 * 1.0)  # se of X - span Y: the same deviations
    assert b.certificate == pytest.approx(3.0 - 1.0 - Z95)


def test_team_advantages_hand_computed():
    """G_t sums every later token reward of the episode, every agent's; b is the mean over the group's other
    episodes of the return from the start of the same turn."""
    rewards = {
        "e1": [np.array([0.0, 1.0]), np.array([0.5])],  # turn 0 (two tokens), turn 1
        "e2": [np.array([0.0, 0.0]), np.array([1.0])],
        "e3": [np.array([2.0])],  # another group
    }
    turns = {"e1": [0, 1], "e2": [0, 1], "e3": [0]}
    adv = team_advantages(rewards, turns, {"e1": "g", "e2": "g", "e3": "h"})
    # e1: G = [1.5, 1.5 | 0.5]; e2: G = [1.0, 1.0 | 1.0]; baselines from the other episode of the group
    np.testing.assert_allclose(adv["e1"][0], [1.5 - 1.0, 1.5 - 1.0])
    np.testing.assert_allclose(adv["e1"][1], [0.5 - 1.0])
    np.testing.assert_allclose(adv["e2"][0], [1.0 - 1.5, 1.0 - 1.5])
    np.testing.assert_allclose(adv["e2"][1], [1.0 - 0.5])
    np.testing.assert_allclose(adv["e3"][0], [2.0])  # alone in its group: no baseline


def test_the_team_advantage_certifies_what_an_agents_own_advantage_would_overstate():
    """Agent a writes one token, y (a's reward 1.0) or x (0.5); agent b is then rewarded 1 after x, 0 after y.
    a's update moves P(y) from 0.5 to 0.6, so J falls by 0.1 * (1.5 - 1.0) = 0.05. The surrogate built on the
    team's advantage estimates that fall and the bound stays below it; a's own advantage (its reward minus a
    baseline) sees only a's part and would certify a gain of about +0.05."""
    rng = np.random.default_rng(0)
    n, size = 4000, 4
    took_y = rng.random(n) < 0.5
    rho = np.where(took_y, 0.6 / 0.5, 0.4 / 0.5)
    own = np.where(took_y, 1.0, 0.5)
    rewards = {f"e{k}": [np.array([own[k]]), np.array([0.0 if took_y[k] else 1.0])] for k in range(n)}
    groups = {f"e{k}": f"g{k // size}" for k in range(n)}
    adv = team_advantages(rewards, {e: [0, 1] for e in rewards}, groups)
    terms = [
        episode_terms([Segment("a", np.array([rho[k]]), adv[f"e{k}"][0]), Segment("b", np.array([1.0]))], "a", set())
        for k in range(n)
    ]
    x, y = map(np.array, zip(*terms))
    b = bound(x, y, list(groups.values()), span=2.0)
    true_change = 0.1 * (1.0 - 1.5)
    assert b.penalty_occ == 0.0  # a has no later tokens, b was not changed
    assert abs(b.gain - true_change) < 3 * b.penalty_est / Z95
    assert b.certificate <= true_change
    own_gain = np.mean((rho - 1) * (own - own.mean()))
    assert own_gain > 0.04  # what the per-agent advantage would have reported as a gain


def test_exact_penalty_matches_monte_carlo():
    """The toy's dynamic programming for E[Y] against the per-episode formula on sampled episodes."""
    full, pi = occ.random_team(np.random.default_rng(5), 3, 4, 3, 2, 0.5)
    rng = np.random.default_rng(0)
    new = pi.copy()
    new[0] = occ.softmax(np.log(pi[0]) + rng.normal(size=pi[0].shape) * 0.3)
    new[1] = occ.softmax(np.log(pi[1]) + rng.normal(size=pi[1].shape) * 0.3)
    exact = truth.exact_penalty(full, pi, new, 1, {0})
    ys = []
    for _ in range(8):
        s = rng.choice(len(full.rho0), size=4000, p=full.rho0)
        ratio = np.ones((4000, 6))
        for h in range(6):
            j = h // 2
            p = pi[j][s]
            a = (rng.uniform(size=(4000, 1)) > p.cumsum(1)).sum(1).clip(max=2)
            ratio[:, h] = new[j][s, a] / p[np.arange(4000), a]
            q = full.P[j][s, a]
            s = (rng.uniform(size=(4000, 1)) > q.cumsum(1)).sum(1).clip(max=3)
        ys += [
            episode_terms([Segment(str(j), ratio[e, 2 * j : 2 * j + 2], np.zeros(2)) for j in range(3)], "1", {"0"})[1]
            for e in range(4000)
        ]
    assert np.mean(ys) == pytest.approx(exact, rel=0.05)


@pytest.fixture(scope="module")
def toy():
    import pandas as pd

    args = argparse.Namespace(
        n_max=5,
        teams=6,
        deltas=[1e-6, 1e-5, 1e-3, 1e-2],
        tokens=3,
        states=6,
        actions=4,
        rewrite=0.05,
        episodes=128,
        sampled_teams=1,
        sample_seed=0,
    )
    return pd.DataFrame(truth.measure(args))


def test_the_certificate_never_exceeds_the_true_improvement_and_certifies_small_steps(toy):
    assert len(toy) >= 400
    assert (toy["certificate"] <= toy["dJ"]).all(), toy[toy["certificate"] > toy["dJ"]]
    small = toy[(toy["delta"] <= 1e-5) & (toy["strategy"] == "teamtr") & (toy["dJ"] > 0)]
    assert (small["certificate"] > 0).mean() > 0.5
    # the surrogate alone is no bound: without the penalty the check would fail
    assert (toy["gain"] > toy["dJ"]).any()


def test_stale_certifies_less_than_teamtr_on_the_same_teams(toy):
    for _, g in toy.groupby("delta"):
        t, s = g[g["strategy"] == "teamtr"], g[g["strategy"] == "stale"]
        assert s["penalty"].mean() > t["penalty"].mean()


def test_the_sampled_certificate_holds_at_its_confidence(toy):
    smp = toy.dropna(subset=["sampled"])
    assert len(smp) >= 100
    assert (smp["sampled"] > smp["dJ"]).mean() <= 0.1
