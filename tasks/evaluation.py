"""Held-out evaluation statistics as pure functions."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: quantiles of means of resamples with replacement."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def regressions(values) -> int:
    """Number of drops between consecutive evaluations: #{t : v_t < v_(t-1)}."""
    v = np.asarray(values, dtype=np.float64)
    return int((np.diff(v) < 0).sum())


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean over seeds: mean ± t_(n-1) · sd / √n (NaN below 2 values)."""
    from scipy import stats

    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return (float("nan"), float("nan"))
    sd = v.std(ddof=1)
    if sd == 0:
        return (float(v.mean()), float(v.mean()))
    lo, hi = stats.t.interval(level, v.size - 1, loc=v.mean(), scale=sd / np.sqrt(v.size))
    return float(lo), float(hi)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a rate k/n: the quantiles of Beta(k, n−k+1) and Beta(k+1, n−k)."""
    from scipy import stats

    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def seed_bootstrap(
    diffs: list[np.ndarray], n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """The mean over seeds of each seed's mean paired difference over its questions, with a percentile
    bootstrap interval that resamples the seeds and, within each drawn seed, its questions."""
    # estimate: (1/S) sum_s mean_q d[s][q]; a replicate: S seeds s* drawn with replacement, each with n_s* questions
    rng = np.random.default_rng(seed)
    s = len(diffs)
    # within[seed, rep, slot]: the mean of a resample of that seed's questions
    within = np.stack([d[rng.integers(0, d.size, size=(n_boot, s, d.size))].mean(axis=2) for d in diffs])
    reps = within[rng.integers(0, s, size=(n_boot, s)), np.arange(n_boot)[:, None], np.arange(s)].mean(axis=1)
    a = (1 - level) / 2
    return float(np.mean([d.mean() for d in diffs])), float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


MIN_SEEDS = 3  # below this, no interval over seeds is trusted enough to call a difference shown


def verdict(n_seeds: int, mean: float, low: float, high: float) -> str:
    """The rule every report applies to a difference A − B with its seed-level interval [low, high]:
    `shown` with at least MIN_SEEDS seeds and low > 0; `shown reversed` likewise with high < 0 (B − A is
    shown); otherwise `not shown` where the estimate is <= 0, else `not settled`."""
    if n_seeds >= MIN_SEEDS and low > 0:
        return "shown"
    if n_seeds >= MIN_SEEDS and high < 0:
        return "shown reversed"
    return "not shown" if not mean > 0 else "not settled"
