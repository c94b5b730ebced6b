"""The fault-injection spec (infra/faults.py): which hit fires, what each action does, and a clear error for
an action it does not know."""

from __future__ import annotations

import pytest

from infra import faults


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch):
    monkeypatch.setattr(faults, "_hits", {})


def test_raise_fires_from_the_nth_hit_on_and_only_at_its_point(monkeypatch):
    monkeypatch.setenv("TEAMRL_FAULT", "update:2:raise")
    faults.crash_point("collect_rollouts")  # another point: no effect, not counted
    faults.crash_point("update")
    for _ in range(2):  # a retried task keeps failing
        with pytest.raises(faults.InjectedFault, match="update"):
            faults.crash_point("update")


def test_hang_sleeps_at_the_nth_hit_only(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.setenv("TEAMRL_FAULT", "interrupted:2:hang")
    faults.crash_point("interrupted")
    assert slept == []
    faults.crash_point("interrupted")
    faults.crash_point("interrupted")
    assert slept == [3600]


@pytest.mark.parametrize("spec, fires_at", [("partition", 1), ("partition:3", 3)])
def test_kill_is_the_default_action(monkeypatch, spec, fires_at):
    sent = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setenv("TEAMRL_FAULT", spec)
    for hit in range(1, 5):
        faults.crash_point("partition")
        assert sent == ([faults.signal.SIGKILL] if hit >= fires_at else [])


def test_an_unknown_action_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("TEAMRL_FAULT", "update:1:explode")
    with pytest.raises(ValueError, match="kill .*raise or hang, not 'explode'"):
        faults.crash_point("update")
