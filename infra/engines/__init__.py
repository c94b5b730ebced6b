"""Engines by name: where rollouts are generated and where gradient steps run.

| kind | name | class | needs |
|---|---|---|---|
| generation | `hf` (default) | `infra.engines.hf.HFGeneration`: transformers `generate` on the team's model | |
| generation | `vllm` | `infra.engines.vllm.VLLMGeneration`: vLLM, one LoRA adapter per agent | `pip install -e .[gpu]` |
| trainer | `torch` (default) | `infra.engines.torch.TorchTrainer`: plain PyTorch + AdamW | |
| trainer | `deepspeed` | `infra.engines.deepspeed.DeepSpeedTrainer`: DeepSpeed ZeRO (stage 3 by default) | `pip install -e .[gpu]` |

The table holds module paths, not classes: resolving a name imports only that engine's module, and an
engine module imports its GPU library only when an engine is built. So the CPU install never imports
vllm or deepspeed, and asking for one that is not installed fails with a message naming the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from infra.errors import TeamrlError
from infra.plugins import Registry


@dataclass(frozen=True)
class EngineSpec:
    target: str  # "module:Class"
    requires: tuple[str, ...]  # top-level packages the engine imports when built
    extra: str | None = None  # the pyproject extra that installs them


REGISTRY: dict[str, Registry[EngineSpec]] = {
    "generation": Registry("generation engine"),
    "trainer": Registry("trainer engine"),
}
REGISTRY["generation"].register("hf", EngineSpec("infra.engines.hf:HFGeneration", ()))
REGISTRY["generation"].register("vllm", EngineSpec("infra.engines.vllm:VLLMGeneration", ("vllm",), "gpu"))
REGISTRY["trainer"].register("torch", EngineSpec("infra.engines.torch:TorchTrainer", ()))
REGISTRY["trainer"].register("deepspeed", EngineSpec("infra.engines.deepspeed:DeepSpeedTrainer", ("deepspeed",), "gpu"))
# the names registered so far: teamrl's own, before a plugin module can add one (the config form offers them)
BUILT_IN = {kind: tuple(registry) for kind, registry in REGISTRY.items()}


class EngineUnavailable(TeamrlError, RuntimeError):
    """An engine name that is unknown, or whose library is not installed."""

    resumable = True


def known(kind: str) -> list[str]:
    if kind not in REGISTRY:
        raise EngineUnavailable(f"unknown engine kind {kind!r}; kinds: {', '.join(sorted(REGISTRY))}")
    return sorted(REGISTRY[kind])


def missing_packages(kind: str, name: str) -> list[str]:
    """The packages engine `name` needs that are not installed (found without importing them)."""
    return [p for p in _spec(kind, name).requires if importlib.util.find_spec(p) is None]


def check(engines) -> None:
    """Refuse, before a run starts, the engines of an EnginesConfig that cannot be built here (unknown, or
    their library missing: the error names the extra to install)."""
    require("generation", engines.generation)
    require("trainer", engines.trainer)


def engine_class(kind: str, name: str) -> type:
    """The class registered as `name` for `kind` ("generation" or "trainer")."""
    spec = require(kind, name)
    module, cls = spec.target.split(":")
    return getattr(importlib.import_module(module), cls)


def require(kind: str, name: str) -> EngineSpec:
    """Engine `name` of `kind`, refused with an EngineUnavailable when unknown or not installed."""
    spec = _spec(kind, name)
    if missing := missing_packages(kind, name):
        hint = f"pip install -e .[{spec.extra}]" if spec.extra else f"pip install {' '.join(missing)}"
        raise EngineUnavailable(
            f"{kind} engine {name!r} needs {', '.join(missing)}, which is not installed here: "
            f"`{hint}` on a machine with a GPU (docs/guides/gpus-and-ray.md)"
        )
    return spec


def _spec(kind: str, name: str) -> EngineSpec:
    names = known(kind)
    if name not in REGISTRY[kind]:
        raise EngineUnavailable(f"unknown {kind} engine {name!r}; known: {', '.join(names)}")
    return REGISTRY[kind][name]
