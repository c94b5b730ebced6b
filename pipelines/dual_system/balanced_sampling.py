"""Advantage-weighted balanced sampling (MARS): System 1 yields a variable number of samples per
trajectory (tool calls x bins), System 2 one; System 1's samples are resampled to exactly System 2's
count so neither system dominates the shared update budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def balanced_counts(advantages: np.ndarray, target: int, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Duplication count per sample, summing to `target`. More samples than `target`: draw `target`
    without replacement; fewer: keep each once and draw the rest by duplication. Draws have
    p_i = |A_i| / sum |A| (`advantage`; uniform when every |A| is 0) or p_i = 1/n (`uniform`)."""
    n = len(advantages)
    if n == 0 or target <= 0:
        return np.zeros(n, dtype=np.int64)
    if mode not in ("advantage", "uniform"):
        raise ValueError(f"unknown balance mode {mode!r}: advantage | uniform")
    w = np.abs(np.asarray(advantages, dtype=np.float64))
    if mode == "uniform" or w.sum() == 0:
        w = np.ones(n)
    counts = np.zeros(n, dtype=np.int64)
    if target <= n:
        nonzero = int((w > 0).sum())
        k = min(target, nonzero)  # without replacement, only samples with p > 0 can be drawn
        counts[rng.choice(n, size=k, replace=False, p=w / w.sum())] = 1
        if k < target:  # fewer nonzero-advantage samples than slots: fill uniformly from the rest
            rest = np.flatnonzero(counts == 0)
            counts[rng.choice(rest, size=target - k, replace=False)] = 1
        return counts
    counts[:] = 1
    np.add.at(counts, rng.choice(n, size=target - n, replace=True, p=w / w.sum()), 1)
    return counts


def balance_system1(rows: list[dict], systems: Sequence[int], mode: str, rng: np.random.Generator) -> None:
    """Set the `weight` (duplication count) of the System-1 rows (`systems[i]` is row i's system) so they
    number exactly as many as System 2's samples, one per trajectory, drawn with p ~ |A| (`advantage`) or
    uniformly; `off` keeps every one once. A row of weight 0 (no advantage) counts for neither system."""
    live = [(r, s) for r, s in zip(rows, systems) if r["weight"] > 0]
    s1 = [r for r, s in live if s == 1]
    if not s1 or mode == "off":
        return
    target = len({r["episode_id"] for r, s in live if s == 2})
    mean_abs = [float(np.abs(r["advantages"]).mean()) if r["advantages"] else 0.0 for r in s1]
    for r, c in zip(s1, balanced_counts(np.array(mean_abs), target, mode, rng)):
        r["weight"] = int(c)
