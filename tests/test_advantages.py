"""Advantage math (tasks/advantages.py) against numbers worked out by hand."""

import math

import numpy as np
import pytest

from tasks.advantages import (
    ESTIMATORS,
    Sample,
    action_kl,
    blend_score,
    estimate,
    grpo,
    kl_penalty,
    reinforce_pp,
    returns_to_go,
    rloo,
    token_rewards,
    whiten,
)


def S(score, n=1, *, ep="e1", group="g1", agent="solver", turn=0, logp=None, ref=None):
    """A sample with `n` tokens; log-probs default to equal policy/reference (zero KL)."""
    logp = np.full(n, -1.0) if logp is None else np.asarray(logp, float)
    ref = logp.copy() if ref is None else np.asarray(ref, float)
    return Sample(ep, group, agent, turn, logp, ref, score)


def close(actual, expected, tol=1e-6):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


# d = logp - ref = [-1 - (-1.5), -2 - (-1)] = [0.5, -1.0]
@pytest.mark.parametrize(
    "kind, expected",
    [
        ("k1", [0.5, -1.0]),  # d
        ("k2", [0.125, 0.5]),  # d^2 / 2 = 0.25/2, 1/2
        (
            "k3",
            [
                math.exp(-0.5) - 0.5,  # e^-d - 1 + d = 0.6065307 - 1 + 0.5 = 0.1065307
                math.e - 2.0,
            ],
        ),  # e^1 - 1 - 1 = 0.7182818
    ],
)
def test_kl_penalty(kind, expected):
    np.testing.assert_allclose(kl_penalty(np.array([-1.0, -2.0]), np.array([-1.5, -1.0]), kind), expected, rtol=1e-9)


def test_action_kl_needs_reference_logprobs_only_with_a_penalty():
    no_ref = Sample("e1", "g1", "solver", 2, np.array([-1.0, -2.0]), None, 1.0)
    np.testing.assert_array_equal(action_kl(no_ref, 0.0, "k1"), [0.0, 0.0])  # beta = 0: no reference pass
    np.testing.assert_allclose(action_kl(S(1.0, logp=[-1, -2], ref=[-1.5, -1]), 0.1, "k1"), [0.5, -1.0])
    with pytest.raises(ValueError, match="e1 turn 2 has no reference log-probs.*kl_coef = 0"):
        action_kl(no_ref, 0.1, "k1")


def test_kl_penalty_unknown_kind():
    with pytest.raises(ValueError, match="k9"):
        kl_penalty(np.zeros(1), np.zeros(1), "k9")


@pytest.mark.parametrize(
    "coach, outcome, w, expected",
    [
        (7, None, 0.5, 0.7),  # no outcome: 7/10 whatever w is
        (7, 1.0, 0.0, 0.7),  # w = 0: 7/10
        (6, 1.0, 0.5, 0.8),  # 0.5*0.6 + 0.5*1.0
        (6, 0.0, 0.25, 0.45),  # 0.75*0.6 + 0.25*0.0
        (6, 1.0, 1.0, 1.0),  # w = 1: the outcome only
    ],
)
def test_blend_score(coach, outcome, w, expected):
    assert blend_score(coach, outcome, w) == pytest.approx(expected)


def test_token_rewards_and_returns_to_go():
    # r = -0.1 * [0.5, -1, 2] + [0, 0, 0.7] = [-0.05, 0.1, -0.2 + 0.7]
    r = token_rewards(np.array([0.5, -1.0, 2.0]), score=0.7, beta=0.1)
    np.testing.assert_allclose(r, [-0.05, 0.1, 0.5])
    # G = [-0.05 + 0.1 + 0.5, 0.1 + 0.5, 0.5]
    np.testing.assert_allclose(returns_to_go(r), [0.55, 0.6, 0.5])
    assert len(token_rewards(np.zeros(0), 1.0, 0.1)) == 0


def test_whiten_over_the_whole_batch():
    # all tokens: [1, 2, 3] -> mean 2, population std sqrt(2/3); 1/sqrt(2/3) = sqrt(1.5) = 1.2247449
    close(whiten([np.array([1.0, 2.0]), np.array([3.0])], eps=0.0), [[-1.2247449, 0.0], [1.2247449]])
    assert whiten([]) == []


def test_whiten_below_min_std_only_centres():
    values = [np.array([1.0, 1.002]), np.array([0.998])]  # mean 1, std 0.0016
    close(whiten(values, eps=0.0, min_std=0.01), [[0.0, 0.002], [-0.002]])
    close(whiten(values, eps=0.0, min_std=0.001), whiten(values, eps=0.0))  # above it: divided as before


def test_reinforce_pp_with_equal_scores_keeps_kl_noise_small_under_min_std():
    """Two actions scored alike: the returns differ only by the KL shaping, which plain whitening scales up
    to unit advantages; with whiten_min_std they stay in the reward's units."""
    rng = np.random.default_rng(0)
    samples = [S(1.0, n, ep=f"e{n}", logp=-1 - rng.uniform(0, 0.02, n), ref=np.full(n, -1.0)) for n in (5, 20)]
    plain = np.concatenate(reinforce_pp(samples, beta=0.01, eps=1e-6))
    guarded = np.concatenate(reinforce_pp(samples, beta=0.01, eps=1e-6, min_std=0.01))
    assert np.abs(plain).max() > 1.0 and np.abs(guarded).max() < 1e-2
    varied = [S(1.0, 5, ep="a"), S(0.0, 5, ep="b")]  # real score variance: whitened either way
    close(reinforce_pp(varied, min_std=0.01), reinforce_pp(varied))


def test_reinforce_pp_action_scope_with_kl():
    a = S(1.0, n=2)  # zero KL: r = [0, 1]        -> G = [1, 1]
    b = S(0.0, n=1, logp=[-1.0], ref=[-2.0])  # k1 = 1: r = [-0.5*1 + 0]  -> G = [-0.5]
    # batch [1, 1, -0.5]: mean 0.5, deviations [.5, .5, -1], var 1.5/3 = 0.5, std 0.7071068
    close(reinforce_pp([a, b], beta=0.5, return_scope="action", eps=0.0), [[0.7071068, 0.7071068], [-1.4142136]])


def _scope_batch():
    # listed out of turn order on purpose; beta = 0, so r = [0, ..., 0, s]
    return [
        S(0.3, n=1, ep="e1", agent="solver", turn=2),
        S(0.5, n=2, ep="e1", agent="solver", turn=0),
        S(0.9, n=1, ep="e1", agent="verifier", turn=1),  # another agent in the same episode
        S(0.1, n=1, ep="e2", agent="solver", turn=0),  # the same agent in another episode
    ]


@pytest.mark.parametrize(
    "scope, expected",
    [
        # action: G = [0.3], [0.5, 0.5], [0.9], [0.1]; tokens [.3 .5 .5 .9 .1] mean 0.46,
        # dev [-.16 .04 .04 .44 -.36], var 0.352/5 = 0.0704, std 0.2653300
        ("action", [[-0.6030227], [0.1507557, 0.1507557], [1.6583124], [-1.3568011]]),
        # agent: e1/solver chain by turn = turn 0 [0, .5] then turn 2 [.3] -> G = [.8, .8 | .3];
        # verifier and e2 are separate chains. tokens [.3 .8 .8 .9 .1] mean 0.58,
        # dev [-.28 .22 .22 .32 -.48], var 0.508/5 = 0.1016, std 0.3187475
        ("agent", [[-0.8784381], [0.6902014, 0.6902014], [1.0039293], [-1.5058939]]),
    ],
)
def test_reinforce_pp_return_scope(scope, expected):
    close(reinforce_pp(_scope_batch(), beta=0.0, return_scope=scope, eps=0.0), expected)


def test_reinforce_pp_agent_scope_carries_later_kl_back():
    # chain: turn 0 (zero KL, score 0) r = [0]; turn 1 (k1 = 0 - (-2) = 2, beta 0.25, score 1) r = [-0.5 + 1] = [0.5]
    # -> G = [0 + 0.5, 0.5]; a lone action elsewhere: G = [1].
    # batch [.5, .5, 1]: mean 2/3, dev [-1/6, -1/6, 1/3], var (1/36 + 1/36 + 4/36)/3 = 1/18, std 0.2357023
    first, later = S(0.0, turn=0), S(1.0, turn=1, logp=[0.0], ref=[-2.0])
    other = S(1.0, ep="e9")
    out = reinforce_pp([first, later, other], beta=0.25, return_scope="agent", eps=0.0)
    # (-1/6) / 0.2357023 = -0.7071068; (1/3) / 0.2357023 = 1.4142136
    close(out, [[-0.7071068], [-0.7071068], [1.4142136]])


def test_reinforce_pp_unknown_scope():
    with pytest.raises(ValueError, match="return_scope"):
        reinforce_pp([S(1.0)], return_scope="team")


def test_grpo_groups_by_group_and_agent():
    samples = [
        S(0.2, n=2),
        S(0.6),
        S(1.0),  # g1/solver: mean 0.6, std sqrt(0.32/3) = 0.3265986
        S(0.0, agent="verifier"),  # g1/verifier: a group of one -> 0
        S(0.9, n=3, group="g2"),
    ]  # g2/solver: a group of one -> 0
    # (0.2 - 0.6) / 0.3265986 = -1.2247449, broadcast over the action's tokens
    close(grpo(samples), [[-1.2247449] * 2, [0.0], [1.2247449], [0.0], [0.0] * 3], tol=1e-5)


def test_rloo_leave_one_out_baseline():
    samples = [S(0.2, n=2), S(0.6), S(1.0), S(0.9, group="g2")]
    # 0.2 - (0.6 + 1.0)/2 = -0.6;  0.6 - (0.2 + 1.0)/2 = 0;  1.0 - (0.2 + 0.6)/2 = 0.6;  lone -> 0
    close(rloo(samples), [[-0.6, -0.6], [0.0], [0.6], [0.0]])


def test_registry_names():
    assert {"reinforce_pp", "grpo", "rloo"} <= set(ESTIMATORS)


def test_the_built_in_estimators_declare_their_traits():
    """Only REINFORCE++ has a KL term in the reward; only MARS's GRPO sees whole trajectories."""
    traits = {name: ESTIMATORS.traits(name) for name in ("reinforce_pp", "grpo", "grpo_trajectory", "rloo")}
    assert {n for n, t in traits.items() if t.uses_kl} == {"reinforce_pp"}
    assert {n for n, t in traits.items() if t.trajectory} == {"grpo_trajectory"}


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_estimate_skips_missing_scores(missing):
    samples = [S(0.5, n=2), S(missing, n=3), S(1.0)]
    # grpo on the two scored: mean 0.75, std 0.25 -> [-1, +1]; the missing one gets None
    close(estimate("grpo", samples), [[-1.0, -1.0], None, [1.0]], tol=1e-5)
    # reinforce_pp (beta 0): G = [.5, .5], [1] (the missing action's tokens are not in the batch statistics):
    # mean 2/3, var (1/36 + 1/36 + 4/36)/3 = 1/18, std 0.2357023 -> (-1/6)/std = -0.7071068, (1/3)/std = 1.4142136
    close(estimate("reinforce_pp", samples, beta=0.0, eps=0.0), [[-0.7071068] * 2, None, [1.4142136]])


def test_unscaled_advantages_are_in_the_rewards_units():
    """`scale=False` (the certificate's raw advantages): the same estimate before dividing by a std."""
    samples = [S(0.5, n=2), S(None, n=3), S(1.0)]
    close(estimate("grpo", samples, scale=False), [[-0.25, -0.25], None, [0.25]])  # s - group mean 0.75
    close(estimate("reinforce_pp", samples, beta=0.0, scale=False), [[-1 / 6] * 2, None, [1 / 3]])  # G - mean 2/3
