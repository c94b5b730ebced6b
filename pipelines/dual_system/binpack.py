"""First Fit Decreasing bin packing of tool outputs into System-1 context budgets (MARS).

Items are token counts. An item longer than a bin is first cut into capacity-sized pieces; then the
pieces are sorted by size, largest first, and each goes into the first open bin it fits in (a new bin
when none has room). FFD uses at most 11/9 OPT + 6/9 bins and is exact on many small instances.
"""

from __future__ import annotations

import math


def split_oversized(sizes: list[int], capacity: int) -> list[tuple[int, int, int]]:
    """Pieces (item index, start, end) of every item, an item longer than `capacity` cut into chunks
    of `capacity` (the last one shorter); a zero-size item is dropped."""
    if capacity < 1:
        raise ValueError(f"bin capacity must be >= 1 token, got {capacity}")
    pieces = []
    for i, n in enumerate(sizes):
        if n < 0:
            raise ValueError(f"item {i} has negative size {n}")
        pieces += [(i, s, min(s + capacity, n)) for s in range(0, n, capacity)]
    return pieces


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """Bins as lists of indices into `sizes` (each <= capacity): sort decreasing (ties by index, so the
    result is deterministic), put each item into the first bin with room, else open a new bin."""
    if any(n > capacity for n in sizes):
        raise ValueError(f"an item is larger than the bin capacity {capacity}: split it first")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        b = next((j for j, f in enumerate(free) if sizes[i] <= f), None)
        if b is None:
            bins.append([])
            free.append(capacity)
            b = len(bins) - 1
        bins[b].append(i)
        free[b] -= sizes[i]
    return bins


def lower_bound(sizes: list[int], capacity: int) -> int:
    """No packing uses fewer bins than ceil(sum of sizes / capacity)."""
    return math.ceil(sum(sizes) / capacity)


def pack(sizes: list[int], capacity: int) -> list[list[tuple[int, int, int]]]:
    """Split oversized items, then FFD: bins of pieces (item index, start, end)."""
    pieces = split_oversized(sizes, capacity)
    bins = first_fit_decreasing([e - s for _, s, e in pieces], capacity)
    return [[pieces[j] for j in b] for b in bins]
