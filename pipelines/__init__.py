"""WHAT is trained: teams, their environments and tools, task sets and outcome scorers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, PlainValidator, Tag, TypeAdapter, WithJsonSchema

from infra.plugins import Registry
from pipelines.base import AgentSpec, Pipeline, Problem
from pipelines.deepresearch import DeepResearch, DeepResearchConfig
from pipelines.dsbench import DSBench, DSBenchConfig
from pipelines.mathchat import MathChat, MathChatConfig

PIPELINES: Registry[type[Pipeline]] = Registry("pipeline")
for _cls in (MathChat, DeepResearch, DSBench):
    PIPELINES.register(_cls.name, _cls)
# the names registered so far: teamrl's own, before a plugin module can add one; each is a member of
# PipelineConfig below, tagged with its name
BUILT_IN = tuple(PIPELINES)


def _name(v) -> str:
    return (v.get("name") if isinstance(v, dict) else getattr(v, "name", None)) or "mathchat"


def _member(v) -> str:
    name = _name(v)
    return name if name in BUILT_IN else "registered"


def _registered(v) -> BaseModel:
    """A pipeline registered from outside the package (a module of the run's `plugins`): its class's
    `Config` model validates the section."""
    cls = PIPELINES[_name(v)]
    return v if isinstance(v, cls.Config) else cls.Config.model_validate(v)


# a registered pipeline's section, as JSON schema: any object whose name is not a built-in one, so that a
# built-in section matches exactly one member of the union (Prefect validates parameters against `oneOf`)
_REGISTERED_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "not": {"enum": list(BUILT_IN)}}},
    "required": ["name"],
}

# one config model per pipeline, chosen by its `name` (mathchat when a config leaves it out); the built-in
# ones are spelled out so that their fields have a form in the Prefect UI
PipelineConfig = Annotated[
    Annotated[MathChatConfig, Tag(MathChat.name)]
    | Annotated[DeepResearchConfig, Tag(DeepResearch.name)]
    | Annotated[DSBenchConfig, Tag(DSBench.name)]
    | Annotated[Any, PlainValidator(_registered), WithJsonSchema(_REGISTERED_SCHEMA), Tag("registered")],
    Discriminator(_member),
]


def pipeline_config(raw: dict) -> Any:
    """Validate a `pipeline:` section into its pipeline's config model."""
    return TypeAdapter(PipelineConfig).validate_python(raw)


def build_pipeline(cfg: Any, seed: int) -> Pipeline:
    return PIPELINES[cfg.name](cfg, seed)


__all__ = [
    "AgentSpec",
    "Pipeline",
    "Problem",
    "PipelineConfig",
    "PIPELINES",
    "build_pipeline",
    "pipeline_config",
    "MathChatConfig",
    "DeepResearchConfig",
    "DSBenchConfig",
]
