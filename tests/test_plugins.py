"""Components chosen by name (infra/plugins.py): one registry style for pipelines, estimators, losses and
engines; a name registered twice is an error; an unknown name lists the known ones; each entry keeps the
traits it declared; a component registered from outside the package (tests/recording_plugin.py, named in a
run's `plugins`) is chosen by name like a built-in one, and its engines train a run."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from flows.config import load_config
from infra.errors import UsageError
from infra.plugins import Registry
from tasks.config import ConfigError


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


@dataclass(frozen=True)
class Shape:
    round: bool = False
    sides: int = 0


def test_a_registry_keeps_the_traits_each_entry_declares():
    r: Registry = Registry("widget", Shape)
    r.register("wheel", 1, round=True)

    @r.register("square", sides=4)
    def square():
        return 4

    r.register("blob", 0)
    assert r.traits("wheel") == Shape(round=True) and r.traits("square") == Shape(sides=4)
    assert r.traits("blob") == Shape()  # the traits dataclass's defaults
    with pytest.raises(TypeError, match="colour"):
        r.register("cube", 6, colour="red")
    assert "cube" not in r  # a bad trait registers nothing
    with pytest.raises(ValueError, match="widget 'wheel' is registered twice"):
        r.register("wheel", 2, round=False)
    assert r.traits("wheel").round  # the first registration's traits stand
    with pytest.raises(UsageError, match="unknown widget 'cube'; known: blob, square, wheel"):
        r.traits("cube")
    with pytest.raises(TypeError, match="round"):  # a kind without traits takes none
        Registry("gadget").register("wheel", 1, round=True)


def test_the_engine_registries_refuse_a_taken_name():
    from infra.engines import REGISTRY, EngineSpec

    for kind, taken in (("generation", "hf"), ("trainer", "torch")):
        with pytest.raises(ValueError, match="registered twice"):
            REGISTRY[kind].register(taken, EngineSpec("x:Y", ()))


@pytest.fixture
def recording_plugin():
    """tests/recording_plugin.py, imported by the `plugins` of the test's configs: afterwards its names leave
    the registries and the module leaves sys.modules, so no other test sees them and each test imports it."""
    yield
    from infra.engines import REGISTRY
    from tasks.advantages import ESTIMATORS

    for registry, name in (
        (REGISTRY["generation"], "recording"),
        (REGISTRY["trainer"], "recording"),
        (ESTIMATORS, "centred"),
    ):
        registry.pop(name, None)
    sys.modules.pop("recording_plugin", None)


def test_a_plugin_estimator_is_chosen_by_name_with_the_traits_it_declares(recording_plugin):
    """`centred` (A = R - the batch's mean reward), registered as trajectory-level and without a KL term:
    unknown until a config's `plugins` imports it; then the config reads its traits (kl_coef > 0 refused) and
    `estimate` runs it."""
    from tasks.advantages import ESTIMATORS, EstimatorTraits, Sample, estimate

    with pytest.raises(ConfigError, match="unknown estimator 'centred'"):
        load_config("tiny", ["algorithm.estimator=centred"])
    plugin = ["plugins=[recording_plugin]", "algorithm.estimator=centred"]
    with pytest.raises(ConfigError, match="kl_coef=0.01 does nothing with estimator centred.*uses_kl=True"):
        load_config("tiny", plugin)
    assert load_config("tiny", [*plugin, "algorithm.kl_coef=0"]).algorithm.estimator == "centred"
    assert ESTIMATORS.traits("centred") == EstimatorTraits(uses_kl=False, trajectory=True)
    samples = [Sample(f"e{i}", "g", "a", 0, np.zeros(n), None, s) for i, (n, s) in enumerate([(2, 1.0), (3, 4.0)])]
    got = estimate("centred", samples + [Sample("e9", "g", "a", 0, np.zeros(1), None, None)])
    assert [a.tolist() for a in got[:2]] == [[-1.5, -1.5], [1.5, 1.5, 1.5]] and got[2] is None


def test_a_plugin_engine_passes_the_config_and_an_unknown_one_names_the_known(recording_plugin):
    from infra import engines

    with pytest.raises(
        ConfigError, match=r"engines.generation: .*unknown generation engine 'recording'; known: hf, vllm"
    ):
        load_config("tiny", ["engines.generation=recording"])
    plugin = ["plugins=[recording_plugin]"]
    cfg = load_config("tiny", [*plugin, "engines.generation=recording", "engines.trainer=recording"])
    assert (cfg.engines.generation, cfg.engines.trainer) == ("recording", "recording")
    engines.check(cfg.engines)
    with pytest.raises(
        ConfigError, match=r"engines.trainer: .*unknown trainer engine 'fsdp'; known: deepspeed, recording, torch"
    ):
        load_config("tiny", [*plugin, "engines.trainer=fsdp"])


@pytest.mark.slow
def test_plugin_engines_and_estimator_train_a_tiny_run(prefect_harness, recording_plugin, tmp_path):
    """A run whose generation engine, trainer and estimator are the plugin's: each is the one that ran (the
    estimator once per call with every agent's samples, its `trajectory` trait), and the run trained."""
    from flows.train import train
    from infra import store

    cfg = load_config(
        "tiny",
        [
            f"run.dir={tmp_path}",
            "run.id=recording",
            "iterations=1",
            "evaluate=false",
            "plugins=[recording_plugin]",
            "engines.generation=recording",
            "engines.trainer=recording",
            "algorithm.estimator=centred",
            "algorithm.kl_coef=0",
        ],
    )
    run_dir = Path(train(config=cfg))
    calls = sys.modules["recording_plugin"].CALLS
    agents = set(store.read_table(run_dir, "actions", 1, "rollout")["agent"])
    updated = store.read_table(run_dir, "updates")
    assert agents and {c[1] for c in calls if c[0] == "generate"} == agents
    assert {c[1] for c in calls if c[0] == "train"} == set(updated["agent"]) == agents
    assert {c[1:] for c in calls if c[0] == "estimate"} == {tuple(sorted(agents))}
    assert (updated["version_after"] == 1).all()
