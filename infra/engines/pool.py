"""A client pool: calls to a remote service (the LLM coach's OpenAI-compatible server) with at most
`max_concurrency` in flight, results in input order.

The coach (tasks/coach.py) scores through this interface, so where the calls run can change (threads
here; a pool of remote workers later) without touching the coach. Each call handles its own errors
and retries (the coach never raises from a score), so the pool only bounds concurrency and keeps order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

A = TypeVar("A")
R = TypeVar("R")


class ClientPool:
    """Threads: the calls block on the network, not on Python, so threads are enough."""

    def __init__(self, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency

    def map(self, fn: Callable[[A], R], items: Iterable[A]) -> list[R]:
        items = list(items)
        if not items:
            return []
        with ThreadPoolExecutor(
            max_workers=min(self.max_concurrency, len(items)), thread_name_prefix="teamrl-client"
        ) as pool:
            return list(pool.map(fn, items))
