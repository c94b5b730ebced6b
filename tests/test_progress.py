"""Progress artifacts (infra/progress.py): few Prefect API calls, and the right value at the end."""

import prefect.artifacts as pa
import pytest

from infra import progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def calls(monkeypatch):
    """The Prefect API calls made, and a clock the test moves; every bar counts as inside a Prefect run."""
    log, clock = [], Clock()
    monkeypatch.setattr(pa, "create_progress_artifact", lambda v, description: log.append(("create", v)) or "id")
    monkeypatch.setattr(pa, "update_progress_artifact", lambda aid, progress: log.append((aid, progress)))
    monkeypatch.setattr(progress, "_prefect_progress", lambda d, n: progress._PrefectProgress(d, n, 5.0, clock))
    return log, clock


def test_a_short_stage_costs_one_call_its_artifact_born_at_100(calls):
    log, _ = calls
    with progress.progress_bar("update a it=1", 8) as advance:
        for _ in range(8):
            advance()
    assert log == [("create", 100.0)]


def test_a_long_stage_publishes_every_interval_and_at_its_end(calls):
    log, clock = calls
    with progress.progress_bar("rollouts", 10) as advance:
        for i in range(10):
            clock.t = 2.0 * (i + 1)  # a step per 2 s: publishes at 6, 12 and 18 s, then at the end
            advance()
    assert log == [("create", 30.0), ("id", 60.0), ("id", 90.0), ("id", 100.0)]


def test_an_early_stop_ends_at_100_and_a_failure_stays_where_it_was(calls):
    log, _ = calls
    with progress.progress_bar("update", 10) as advance:  # e.g. the KL early stop after 4 of 10 epochs
        advance(4)
    assert log == [("create", 100.0)]
    log.clear()
    with pytest.raises(RuntimeError, match="out of memory"):
        with progress.progress_bar("update", 10) as advance:
            advance(3)
            raise RuntimeError("out of memory")
    assert log == [("create", 30.0)]
