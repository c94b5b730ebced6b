"""Components chosen by name (infra/plugins.py): one registry style for pipelines, estimators, losses and
engines; a name registered twice is an error; an unknown name lists the known ones; a component registered
from outside the package is chosen by name like a built-in one."""

from __future__ import annotations

import numpy as np
import pytest

from infra.errors import UsageError
from infra.plugins import Registry


def test_a_registry_adds_by_decorator_or_value_and_refuses_a_second_use_of_a_name():
    r: Registry = Registry("widget")

    @r.register("a")
    def a():
        return 1

    r.register("b", 2)
    assert list(r) == ["a", "b"] and r["a"] is a and r["b"] == 2
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        r.register("a", 3)
    assert r["a"] is a  # the first registration stands
    with pytest.raises(UsageError, match="unknown widget 'c'; known: a, b"):
        r["c"]


@pytest.mark.parametrize(
    "module,name,taken",
    [
        ("pipelines", "PIPELINES", "mathchat"),
        ("tasks.advantages", "ESTIMATORS", "grpo"),
        ("tasks.losses", "LOSSES", "ppo_clip"),
    ],
)
def test_the_built_in_registries_refuse_a_taken_name(module, name, taken):
    import importlib

    registry = getattr(importlib.import_module(module), name)
    assert isinstance(registry, Registry) and taken in registry
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(taken, object())


def test_the_engine_registries_refuse_a_taken_name():
    from infra.engines import REGISTRY, EngineSpec

    for kind, taken in (("generation", "hf"), ("trainer", "torch")):
        with pytest.raises(ValueError, match="registered twice"):
            REGISTRY[kind].register(taken, EngineSpec("x:Y", ()))


def test_an_estimator_registered_from_outside_is_chosen_by_name(monkeypatch):
    """A user's estimator (here: A = score - the batch mean, no scaling) passes config validation and is the
    one `estimate` runs; unregistered, the config refuses the name."""
    from tasks import advantages
    from tasks.advantages import ESTIMATORS, Sample, estimate
    from tasks.algorithm import AlgorithmConfig

    with pytest.raises(ValueError, match="unknown estimator 'centred'"):
        AlgorithmConfig(estimator="centred")
    monkeypatch.setattr(advantages, "ESTIMATORS", Registry("estimator"))  # the real one stays untouched
    advantages.ESTIMATORS.update(ESTIMATORS)

    @advantages.ESTIMATORS.register("centred")
    def centred(samples, **_):
        mean = np.mean([s.score for s in samples])
        return [np.full(len(s.logprobs), s.score - mean) for s in samples]

    assert AlgorithmConfig(estimator="centred").estimator == "centred"
    samples = [Sample(f"e{i}", "g", "a", 0, np.zeros(n), None, s) for i, (n, s) in enumerate([(2, 1.0), (3, 4.0)])]
    got = estimate("centred", samples + [Sample("e9", "g", "a", 0, np.zeros(1), None, None)])
    assert [a.tolist() for a in got[:2]] == [[-1.5, -1.5], [1.5, 1.5, 1.5]] and got[2] is None
