"""The `engines` section of the run config: which generation engine and trainer, and their knobs."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.engines.vllm import VLLMConfig
from infra.engines.zero import DeepSpeedConfig


class EnginesConfig(BaseModel):
    """Where generation and training run. CPU defaults; GPU engines plug in behind the same calls."""

    model_config = ConfigDict(extra="forbid")

    generation: Literal["hf", "vllm"] = Field("hf", description="generation engine: `hf` (transformers generate on "
                                              "the team's model) or `vllm` (vLLM, one LoRA adapter per agent; GPU, "
                                              "`pip install -e .[gpu]`)")
    trainer: Literal["torch", "deepspeed"] = Field("torch", description="trainer: `torch` (plain PyTorch + AdamW) or "
                                                   "`deepspeed` (the same loss and AdamW under DeepSpeed ZeRO; GPU, "
                                                   "`pip install -e .[gpu]`)")
    runner: Literal["local"] = Field("local", description="where tasks run: `local` (this process)")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="torch device of the team's model (the "
                        "`hf` engine, the reference pass, the trainer): `cpu`, `cuda` or `cuda:N`")
    batch_size: int = Field(16, ge=1, description="sequences per generate / forward call")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default)")
    rescore_logprobs: bool = Field(False, description="replace the generation engine's log-probs of training "
                                   "rollouts by the trainer model's own (one extra forward per action), so the first "
                                   "PPO ratio is exactly 1 despite kernel differences between vLLM and the trainer; "
                                   "the mean gap is logged as `episode/logprob_gap`")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="the `vllm` generation engine's knobs")
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="the `deepspeed` trainer's knobs")
