"""FFD bin packing and balanced sampling (pipelines/dual_system/binpack.py, balanced_sampling.py)."""

import itertools

import numpy as np
import pytest

from pipelines.dual_system.balanced_sampling import balanced_counts
from pipelines.dual_system.binpack import first_fit_decreasing, lower_bound, pack, split_oversized


def test_ffd_hand_example():
    # sorted: 7(2) 5(0) 4(4) 3(3) 2(1) 2(5); capacity 10 -> [7,3], [5,4], [2,2]
    assert first_fit_decreasing([5, 2, 7, 3, 4, 2], 10) == [[2, 3], [0, 4], [1, 5]]


@pytest.mark.parametrize(
    "sizes,capacity,optimum",
    [
        ([6, 6, 4, 4], 10, 2),  # 6+4, 6+4
        ([5, 5, 5, 5, 5, 5], 10, 3),
        ([9, 1, 8, 2, 7, 3], 10, 3),
        ([4, 4, 4, 3, 3, 3, 2, 2, 2, 2, 1], 10, 3),  # sum 30
        ([10, 10, 10], 10, 3),
        ([1] * 25, 5, 5),
    ],
)
def test_ffd_optimal_on_known_instances(sizes, capacity, optimum):
    bins = first_fit_decreasing(sizes, capacity)
    assert len(bins) == optimum == lower_bound(sizes, capacity)


def test_ffd_invariants_on_random_instances():
    rng = np.random.default_rng(0)
    for _ in range(300):
        cap = int(rng.integers(1, 60))
        sizes = [int(s) for s in rng.integers(0, cap + 1, size=rng.integers(0, 40))]
        bins = first_fit_decreasing(sizes, cap)
        assert sorted(itertools.chain(*bins)) == list(range(len(sizes)))  # each item exactly once
        assert all(sum(sizes[i] for i in b) <= cap for b in bins)  # never over capacity
        assert len(bins) >= lower_bound(sizes, cap)
        assert len(bins) <= max(2 * lower_bound(sizes, cap), min(len(sizes), 1))  # no two bins both half empty
        assert first_fit_decreasing(sizes, cap) == bins  # deterministic


def test_ffd_rejects_an_item_over_capacity():
    with pytest.raises(ValueError, match="split it first"):
        first_fit_decreasing([3, 11], 10)


def test_split_and_pack_cover_every_token_once():
    assert split_oversized([25, 4, 0], 10) == [(0, 0, 10), (0, 10, 20), (0, 20, 25), (1, 0, 4)]
    sizes = [2000, 50, 480, 700, 130]
    bins = pack(sizes, 512)
    covered = {i: [] for i in range(len(sizes))}
    for b in bins:
        assert sum(e - s for _, s, e in b) <= 512
        for i, s, e in b:
            covered[i].append((s, e))
    for i, n in enumerate(sizes):
        spans = sorted(covered[i])
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
    with pytest.raises(ValueError, match="capacity"):
        split_oversized([3], 0)


def test_balanced_counts_exact_totals():
    rng = np.random.default_rng(0)
    adv = np.array([0.5, -1.0, 0.0, 2.0, 0.1])
    for target in (0, 1, 3, 5, 6, 13):
        for mode in ("advantage", "uniform"):
            c = balanced_counts(adv, target, mode, rng)
            assert c.sum() == target and (c >= 0).all()
            if target <= len(adv):
                assert c.max() <= 1  # down-sampling is without replacement
            else:
                assert c.min() >= 1  # up-sampling keeps every sample
    # more slots than nonzero-advantage samples: the zero ones fill up, still without replacement
    c = balanced_counts(np.array([0.0, 1.0, 0.0]), 2, "advantage", rng)
    assert c[1] == 1 and c.sum() == 2 and c.max() == 1
    assert balanced_counts(np.zeros(0), 4, "advantage", rng).sum() == 0
    with pytest.raises(ValueError, match="balance mode"):
        balanced_counts(adv, 2, "greedy", rng)


def test_selection_frequency_follows_abs_advantage():
    """Seeded: up-sampling draws extra copies with p = |A| / sum|A|; chi-square-like closeness."""
    rng = np.random.default_rng(1)
    adv = np.array([0.1, -0.3, 0.6, -1.0])
    p = np.abs(adv) / np.abs(adv).sum()
    extra = np.zeros(4)
    trials = 4000
    for _ in range(trials):
        extra += balanced_counts(adv, 4 + 6, "advantage", rng) - 1
    freq = extra / extra.sum()
    assert np.allclose(freq, p, atol=0.01)
    # down-sampling to 1 slot: the chosen sample's frequency is p as well
    first = np.zeros(4)
    for _ in range(trials):
        first += balanced_counts(adv, 1, "advantage", rng)
    assert np.allclose(first / trials, p, atol=0.02)
    uni = np.zeros(4)
    for _ in range(trials):
        uni += balanced_counts(adv, 1, "uniform", rng)
    assert np.allclose(uni / trials, 0.25, atol=0.02)
