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
