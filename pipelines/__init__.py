"""WHAT is trained: teams, their environments and tools, task sets and outcome scorers."""
from __future__ import annotations

from pipelines.base import AgentSpec, Pipeline, Problem
from pipelines.mathchat import MathChat, MathChatConfig

PipelineConfig = MathChatConfig  # a discriminated union on `name` once more pipelines land

PIPELINES: dict[str, type[Pipeline]] = {"mathchat": MathChat}


def build_pipeline(cfg: PipelineConfig, seed: int) -> Pipeline:
    return PIPELINES[cfg.name](cfg, seed)


__all__ = ["AgentSpec", "Pipeline", "Problem", "PipelineConfig", "PIPELINES", "build_pipeline", "MathChatConfig"]
