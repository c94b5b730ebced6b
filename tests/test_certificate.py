"""TeamTR's certificate (tasks/certificate.py): its terms against hand-computed values; the shipped
functions against the exact improvement of small teams (benchmarks/certificate_truth.py), where a violated
bound, one that never certifies, or a sampled bound that exceeds the truth more often than its level fails;
and the stage certificate, defined only when every applied update has one."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import tasks.certificate as cert
from tasks.certificate import (
    Segment,
    bound,
    cluster_se,
    episode_terms,
    holdout_groups,
    return_span,
    reward_range,
    team_advantages,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import certificate_truth as truth  # noqa: E402

T95_1 = 6.313751514675043  # one-sided 95% quantile of Student's t with 1 degree of freedom


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
    assert b.penalty_est == pytest.approx(T95_1 * 1.0)  # se of X - span Y: the same deviations; 2 groups, 1 df
    assert b.certificate == pytest.approx(3.0 - 1.0 - T95_1)
    assert math.isinf(bound(v, v, ["g"] * 4, span=1.0).penalty_est)  # one group: no estimation term


def test_holdout_groups_by_hand():
    rng = np.random.default_rng(0)
    eight = [f"q{k}" for k in range(8) for _ in range(4)]
    held = holdout_groups(eight, 0.25, rng)
    assert len(held) == 2 and held <= set(eight)  # round(0.25 * 8)
    assert len(holdout_groups(eight[:16], 0.25, rng)) == 2  # round(1.0) is 1: at least two
    assert len(holdout_groups(eight[:12], 0.9, rng)) == 2  # 3 groups: never all
    assert holdout_groups(eight[:8], 0.5, rng) == set()  # 2 groups: none left to train on
    assert holdout_groups(eight, 0.0, rng) == set()
    again = holdout_groups(eight, 0.25, np.random.default_rng(0))
    assert again == held  # seeded: the update and its measurement draw the same groups


def test_the_span_comes_from_bounds_known_in_advance():
    # r = (1 - w) * coach / 10 + w * outcome: w = 0.5, outcome in [-1, 2] gives [-0.5, 1.5]
    assert reward_range((-1.0, 2.0), 0.5, trajectory=False) == (-0.5, 1.5)
    assert reward_range((0.0, 1.0), 0.0, trajectory=False) == (0.0, 1.0)
    assert reward_range((0.2, 0.8), 0.0, trajectory=True) == (0.0, 0.8)  # an unscored episode adds 0
    assert return_span(3, (-0.5, 1.5), trajectory=False) == 6.0  # three actions, each in a range of 2
    assert return_span(3, (0.0, 0.8), trajectory=True) == 0.8  # one trajectory reward


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
    assert abs(b.gain - true_change) < 3 * b.penalty_est / cert.stats.t.ppf(0.95, len(set(groups.values())) - 1)
    assert b.certificate <= true_change
    own_gain = np.mean((rho - 1) * (own - own.mean()))
    assert own_gain > 0.04  # what the per-agent advantage would have reported as a gain


@pytest.fixture(scope="module")
def exact():
    import pandas as pd

    return pd.DataFrame(truth.exact_rows(9, truth.SHAPES, truth.ETAS, truth.BETAS))


def test_the_exact_certificate_never_exceeds_the_true_improvement_and_certifies_small_steps(exact):
    """The shipped episode_terms and Bound over every episode of each team, for beta 0 and 0.01, one- and
    multi-token actions, aligned, anti-aligned and random steps from 1e-4 to 3."""
    assert len(exact) >= 10_000
    assert set(exact["beta"]) == {0.0, 0.01} and set(exact["tokens"]) == {1, 2}
    assert set(exact["direction"]) == set(truth.DIRECTIONS) and set(exact["strategy"]) == {"teamtr", "stale"}
    over = exact[exact["certificate"] > exact["dJ"] + 1e-12]
    assert over.empty, over
    small = exact[(exact["eta"] <= 1e-3) & (exact["dJ"] > 0)]
    assert (small["certificate"] > 0).mean() > 0.5
    assert (exact["gain"] > exact["dJ"] + 1e-12).any()  # the surrogate alone is no bound
    pen = (exact["gain"] - exact["certificate"]).groupby([exact["eta"], exact["strategy"]]).mean().unstack()
    assert (pen["stale"] > pen["teamtr"]).all()  # stale pays the reweighting by every agent updated before


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda terms: lambda s, a, c: (terms(s, a, c)[0], 0.0), id="penalty dropped"),
        pytest.param(
            lambda terms: lambda s, a, c: (terms(s, a, c)[0], terms(s, a, c)[1] if c else 0.0), id="coupling dropped"
        ),
    ],
)
def test_a_mutated_penalty_is_caught_by_the_exact_check(monkeypatch, mutate):
    monkeypatch.setattr(cert, "episode_terms", mutate(cert.episode_terms))
    rows = truth.exact_rows(2, ((2, 2), (3, 1)), truth.ETAS, (0.0,))
    assert any(r["certificate"] > r["dJ"] + 1e-12 for r in rows)


def test_the_sampled_certificate_of_fitted_updates_holds_at_its_level():
    """Updates fitted on 8 x 4 batches, certified by the shipped functions on the held-out groups: the 95%
    bound exceeds the exact dJ in at most 5% of >= 2,000 updates; certified on the batch it was fitted to,
    it exceeds it far more often (the in-sample optimism the held-out groups remove)."""
    import pandas as pd

    df = pd.DataFrame(truth.sampled_rows(56, truth.SAMPLED_ETAS, truth.BETAS))
    held, fitted = df[df["certified_on"] == "held-out"], df[df["certified_on"] == "in-sample"]
    assert len(held) >= 2000
    assert (held["certificate"] > held["dJ"]).mean() <= 0.05
    teamtr = fitted[fitted["strategy"] == "teamtr"]
    assert (teamtr["certificate"] > teamtr["dJ"]).mean() > 0.10


def test_the_stage_certificate_needs_every_applied_update_to_have_one(tmp_path):
    from flows.metrics import update_metrics
    from infra import store

    def row(agent, certificate, skipped=False):
        return {k: None for k in store.SCHEMAS["updates"].names} | {
            "run_id": "r", "agent": agent, "strategy": "teamtr", "skipped": skipped, "certificate": certificate,
            "version_before": 0, "version_after": 0 if skipped else 1, "reason": "",
        }  # fmt: skip

    store.write_partition(tmp_path, "updates", 1, "rollout", [row("a", 0.2), row("b", -0.5)], name="x")
    store.write_partition(tmp_path, "updates", 1, "resample-1", [row("c", None, skipped=True)], name="y")
    m = update_metrics(tmp_path, 1)
    assert m["stage/task_certificate"] == pytest.approx(-0.3) and m["stage/certified"] == 1.0  # c applied nothing
    assert m["task_certificate/a"] == pytest.approx(0.2)
    store.write_partition(tmp_path, "updates", 1, "resample-2", [row("d", None)], name="z")
    m = update_metrics(tmp_path, 1)
    assert "stage/task_certificate" not in m and m["stage/certified"] == 1.0  # d applied an update with none
