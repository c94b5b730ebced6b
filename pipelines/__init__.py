"""WHAT is trained: teams, their environments and tools, task sets and outcome scorers."""

from __future__ import annotations

from typing import Annotated

from pydantic import Discriminator, Tag, TypeAdapter

from infra.plugins import Registry
from pipelines.base import AgentSpec, Pipeline, Problem
from pipelines.deepresearch import DeepResearch, DeepResearchConfig
from pipelines.dsbench import DSBench, DSBenchConfig
from pipelines.mathchat import MathChat, MathChatConfig


def _name(v) -> str:
    return (v.get("name") if isinstance(v, dict) else getattr(v, "name", None)) or "mathchat"


# one config model per pipeline, chosen by its `name` (mathchat when a config leaves it out)
PipelineConfig = Annotated[
    Annotated[MathChatConfig, Tag("mathchat")]
    | Annotated[DeepResearchConfig, Tag("deepresearch")]
    | Annotated[DSBenchConfig, Tag("dsbench")],
    Discriminator(_name),
]


def pipeline_config(raw: dict) -> MathChatConfig | DeepResearchConfig | DSBenchConfig:
    """Validate a `pipeline:` section into its pipeline's config model."""
    return TypeAdapter(PipelineConfig).validate_python(raw)


PIPELINES: Registry[type[Pipeline]] = Registry("pipeline")
for _cls in (MathChat, DeepResearch, DSBench):
    PIPELINES.register(_cls.name, _cls)


def build_pipeline(cfg: MathChatConfig | DeepResearchConfig | DSBenchConfig, seed: int) -> Pipeline:
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
