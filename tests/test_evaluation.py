"""Evaluation statistics against hand-computed values."""

import numpy as np
import pytest

from tasks.evaluation import bootstrap_ci, pass_at_k


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 0, 1, 0.0),
        (4, 4, 2, 1.0),
        (4, 1, 1, 0.25),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (4, 3, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
    ],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError, match="at least 3"):
        pass_at_k(2, 1, 3)


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    v = np.array([1] * 30 + [0] * 70, dtype=float)
    lo, hi = bootstrap_ci(v, seed=0)
    assert lo < 0.3 < hi
    # normal approximation: 0.3 +- 1.96 * sqrt(0.3 * 0.7 / 100) = [0.21, 0.39]
    assert lo == pytest.approx(0.21, abs=0.03) and hi == pytest.approx(0.39, abs=0.03)
    assert bootstrap_ci(v, seed=0) == (lo, hi)
    assert bootstrap_ci(np.ones(10)) == (1.0, 1.0)
    assert all(np.isnan(bootstrap_ci(np.array([]))))


def test_regressions_count_drops_between_consecutive_evaluations():
    from tasks.evaluation import regressions

    assert regressions([0.2, 0.3, 0.25, 0.25, 0.4, 0.1]) == 2
    assert regressions([0.5]) == 0 and regressions([]) == 0
