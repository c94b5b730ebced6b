"""Infrastructure faults: what failed around the agents (a sandbox that would not start, a tool backend
or a scorer that raised), told apart from what the agents did, retried with backoff, then recorded.

An episode that met one is not scored: its actions get no score and no gradient (`coach` status
`error`, `error_kind` `infra_<kind>`), since what the agents saw or how they were judged was not theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import sleep
from typing import Literal, TypeVar

from infra.errors import TeamrlError

log = logging.getLogger(__name__)
T = TypeVar("T")

InfraKind = Literal["sandbox", "tool", "scorer"]
INFRA_KINDS: tuple[str, ...] = ("sandbox", "tool", "scorer")


class InfraFault(RuntimeError):
    """An infrastructure fault that persisted through its retries."""

    def __init__(self, kind: InfraKind, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def infra_record(kind: InfraKind, message: str) -> str:
    """The `infra_error` column's value: `<kind>: <message>`."""
    return f"{kind}: {message}"[:1000]


def infra_kind(record: str | None) -> str | None:
    """The kind of an `infra_error` value (None when there was no fault)."""
    return record.split(":", 1)[0] if record else None


def with_retries(fn: Callable[[], T], kind: InfraKind, what: str, retries: int = 3, backoff_s: float = 0.5) -> T:
    """fn(), retried `retries` times with delays backoff_s * 2^i; the last failure raises InfraFault."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as e:  # any failure of the backend, not of the agents
            log.warning("%s failed (attempt %d of %d): %s: %s", what, attempt + 1, retries + 1, type(e).__name__, e)
            if attempt == retries:
                raise InfraFault(kind, f"{what} failed: {type(e).__name__}: {e}") from e
            sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")


class InfraFaultsExceeded(TeamrlError, RuntimeError):
    """Too many of a partition's actions met infrastructure faults to train on."""

    resumable = True


def infra_share_check(hit: int, total: int, limit: float, where: str, first: str | None) -> None:
    """Raise InfraFaultsExceeded when `hit` of `total` actions is more than the share `limit`."""
    if total and hit / total > limit:
        raise InfraFaultsExceeded(
            f"{where}: {hit} of {total} actions ({hit / total:.0%}) were left unscored by infrastructure faults, "
            f"more than rollout.max_infra_share={limit:g} (first: {first}); nothing of this stage was kept. "
            "Fix the host (sandbox, tool backends, scorer), then resume the run"
        )
