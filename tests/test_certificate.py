"""TeamTR's certificate (tasks/certificate.py): its terms against hand-computed values, and the bound
against the exact improvement of small tabular teams (benchmarks/certificate_truth.py), where a violated
bound, or one that never certifies, fails."""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.certificate import Z95, Segment, bound, cluster_se, episode_terms

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
