"""benchmarks/occupancy_scaling.py: exact occupancy on a hand-computed team, the trust-region step, the
log-log fit, and the scaling claim (stale penalty grows faster than TeamTR's) on small teams."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import occupancy_scaling as occ


def hand_team() -> tuple[occ.Team, np.ndarray]:
    """2 agents, 1 token each, 2 states, 2 actions; token a writes the context: s' = a. Start in s = 0;
    the outcome is 1 in state 1."""
    P = np.zeros((2, 2, 2, 2))
    for a in range(2):
        P[:, :, a, a] = 1.0
    pi = np.array(
        [
            [[0.3, 0.7], [0.5, 0.5]],  # agent 1: pi(.|s=0), pi(.|s=1)
            [[0.5, 0.5], [0.2, 0.8]],
        ]
    )  # agent 2
    return occ.Team(rho0=np.array([1.0, 0.0]), P=P, R=np.array([0.0, 1.0]), tokens=1), pi


def test_occupancy_advantages_return_hand_computed():
    team, pi = hand_team()
    np.testing.assert_allclose(occ.occupancy(team, pi), [[1.0, 0.0], [0.3, 0.7]])
    # J = 0.3 * 0.5 + 0.7 * 0.8
    assert occ.expected_return(team, pi) == pytest.approx(0.71)
    A, V0 = occ.advantages(team, pi)
    np.testing.assert_allclose(V0, [0.71, 0.5 * 0.5 + 0.5 * 0.8])  # agent 1's pi(.|s) on V_1 = [0.5, 0.8]
    np.testing.assert_allclose(A[1], [[-0.5, 0.5], [-0.8, 0.2]])  # agent 2: Q = [0, 1], V = 0.5 / 0.8
    np.testing.assert_allclose(A[0][0], [0.5 - 0.71, 0.8 - 0.71])  # agent 1 in s = 0: Q = V_1 = [0.5, 0.8]


def test_return_forward_equals_backward_on_random_team():
    team, pi = occ.prefix(*occ.random_team(np.random.default_rng(3), 4, 5, 3, 2, 0.2), 3)
    d = occ.occupancy(team, pi)
    assert d.shape == (6, 5)
    np.testing.assert_allclose(d.sum(1), 1.0)
    # J from the last step's occupancy: sum_s d_{H-1}(s) sum_a pi_3(a|s) sum_s' P_3(s'|s,a) R(s')
    forward = np.einsum("s,sa,sat,t->", d[-1], pi[2], team.P[2], team.R)
    assert occ.expected_return(team, pi) == pytest.approx(forward, rel=1e-12)


def test_natural_step_spends_exactly_delta_per_state_and_improves():
    rng = np.random.default_rng(0)
    p, adv = occ.softmax(rng.normal(size=(6, 4))), rng.normal(size=(6, 4))
    new = occ.natural_step(p, adv, 0.01)
    np.testing.assert_allclose(occ.kl(np.log(p), np.log(new)), 0.01, rtol=1e-6)
    assert np.all((new * adv).sum(1) > (p * adv).sum(1))


def test_fit_alpha_recovers_a_power_law():
    ns = np.arange(2, 9)
    assert occ.fit_alpha(ns, 3.0 * ns**1.5) == pytest.approx(1.5)
    noise = np.exp(np.random.default_rng(0).normal(scale=0.01, size=len(ns)))
    assert occ.fit_alpha(ns, 0.2 * ns**2 * noise) == pytest.approx(2.0, abs=0.05)


def test_one_token_per_turn_makes_the_mid_occupancy_surrogate_exact():
    team, pi = occ.random_team(np.random.default_rng(1), 4, 5, 3, 1, 0.1)
    mid, _ = occ.stage(team, pi, 0.01, mid=True)
    stale, _ = occ.stage(team, pi, 0.01, mid=False)
    assert np.abs(mid).max() < 1e-12
    assert occ.penalty(stale) > 1e-7


def test_stale_penalty_grows_faster_than_teamtr():
    args = argparse.Namespace(n_max=5, seeds=6, states=6, actions=4, tokens=3, delta=0.01)
    res = occ.measure(args, rewrite=0.05)
    stale, teamtr = res["stale"].mean(1), res["TeamTR"].mean(1)
    assert occ.fit_alpha(res["ns"], stale) > occ.fit_alpha(res["ns"], teamtr) + 0.5
    assert stale[-1] >= teamtr[-1]


def test_write_section_replaces_only_its_own_section(tmp_path):
    from benchmarks.common import write_section

    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\n## other\n\nkeep\n\n{occ.SECTION}\n\nold\n\n## after\n\nkeep too\n")
    write_section(readme, occ.SECTION, f"{occ.SECTION}\n\nnew\n")
    assert readme.read_text() == f"# Benchmarks\n\n## other\n\nkeep\n\n{occ.SECTION}\n\nnew\n\n## after\n\nkeep too\n"
    readme.write_text("# Benchmarks\n\n## other\n\nkeep\n")
    write_section(readme, occ.SECTION, f"{occ.SECTION}\n\nnew\n")
    assert readme.read_text() == f"# Benchmarks\n\n## other\n\nkeep\n\n{occ.SECTION}\n\nnew\n"
