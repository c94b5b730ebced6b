"""The `engines` section of the run config: which generation engine and trainer, and their knobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from infra.engines import BUILT_IN, REGISTRY
from infra.engines.vllm import VLLMConfig
from infra.engines.zero import DeepSpeedConfig


def registered(kind: str) -> AfterValidator:
    """Accept an engine name of `kind` that is registered when the config is read: a plugin's too, since a
    run config imports its `plugins` before validating its sections."""

    def check(name: str) -> str:
        if name not in REGISTRY[kind]:
            REGISTRY[kind].unknown(name)  # a UsageError (a ValueError) listing the known names
        return name

    return AfterValidator(check)


class RayConfig(BaseModel):
    """Where the rollout workers run when `engines.runner` is `ray`, and the training ranks when
    `engines.train_launcher` is `ray`."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(
        "auto",
        description="Ray cluster to join: `auto` (the cluster `ray start` made on this "
        "machine), `HOST:PORT` of the head node, or `local` (start a private one-node Ray)",
    )
    rollout_workers: int = Field(2, ge=1, le=1024, description="rollout actors, each holding the team's model")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves per actor")
    gpus_per_worker: float = Field(0.0, ge=0, description="GPUs Ray reserves per actor (fractions share one GPU)")
    placement: str = Field(
        "spread",
        pattern="^(spread|strict_spread|pack)$",
        description="placement group strategy of the rollout workers and of the training ranks: spread "
        "(over nodes when possible), strict_spread (one per node, fails if too few nodes) or pack",
    )
    cpus_per_rank: float = Field(1.0, gt=0, description="CPUs Ray reserves per training rank (ranks 1..N-1)")


class EnginesConfig(BaseModel):
    """Where generation and training run. CPU defaults; GPU engines plug in behind the same calls."""

    model_config = ConfigDict(extra="forbid")

    generation: Annotated[str, registered("generation")] = Field(
        "hf",
        examples=list(BUILT_IN["generation"]),
        description="generation engine: `hf` (transformers generate on "
        "the team's model), `vllm` (vLLM, one LoRA adapter per agent; GPU, "
        "`pip install -e .[gpu]`) or one a module of `plugins` registers",
    )
    trainer: Annotated[str, registered("trainer")] = Field(
        "torch",
        examples=list(BUILT_IN["trainer"]),
        description="trainer: `torch` (plain PyTorch + AdamW), "
        "`deepspeed` (the same loss and AdamW under DeepSpeed ZeRO; GPU, "
        "`pip install -e .[gpu]`) or one a module of `plugins` registers",
    )
    runner: Literal["local", "ray"] = Field(
        "local",
        description="where rollouts run: `local` (this process) or "
        "`ray` (long-lived rollout actors on a Ray cluster, `engines.ray`; "
        "`pip install -e .[ray]`)",
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="torch device of the team's model (the "
        "`hf` engine, the reference pass, the trainer): `cpu`, `cuda` or `cuda:N`",
    )
    batch_size: int = Field(16, ge=1, description="sequences per generate / forward call")
    fold_adapter: bool = Field(
        True,
        description="`hf` engine: generate with the acting agent's LoRA adapter folded "
        "into the base weights for the call (about 0.85x the time of the adapter beside every "
        "layer on SmolLM2-135M), at the cost of one extra copy of the adapted weights while "
        "it lasts (+0.4 GiB there); false: the adapter beside every layer, no extra memory",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default)")
    train_ranks: int = Field(
        1,
        ge=1,
        le=64,
        description="processes that train each update together, data-parallel: each takes its share of "
        "every minibatch and the gradients are summed before the step, so N ranks make the same update "
        "as 1 (up to float rounding); the `torch` trainer on CPU (gloo)",
    )
    train_launcher: Literal["spawn", "ray"] = Field(
        "spawn",
        description="how ranks 1..N-1 start (the update's process is rank 0; the others load the model for "
        "the update and exit): `spawn` (torch.multiprocessing on this machine) or `ray` (Ray actors on the "
        "cluster of `engines.ray`, placed by `engines.ray.placement`; the run folder on storage every node sees)",
    )
    rescore_logprobs: bool = Field(
        False,
        description="replace the generation engine's log-probs of training "
        "rollouts by the trainer model's own (one extra forward per action), so the first "
        "PPO ratio is exactly 1 despite kernel differences between vLLM and the trainer; "
        "the mean gap is logged as `episode/logprob_gap`",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="the `vllm` generation engine's knobs")
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="the `deepspeed` trainer's knobs")
    ray: RayConfig = Field(default_factory=RayConfig, description="the `ray` runner's cluster and rollout workers")
