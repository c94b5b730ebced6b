"""The run config as one typed model: each component's own pydantic section (the model, the pipeline, the
rollouts, the coach, the algorithm, the engines, checkpoints) composed into `RunConfig`, with the checks
that span sections. It lives in tasks/ so that a stage reads its run's config typed
(`RunContext.config`, tasks/context.py); flows/config.py loads it from presets and `--set` overrides."""

from __future__ import annotations

import importlib
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.engines.config import EnginesConfig
from infra.errors import TeamrlError
from infra.models import ModelConfig
from infra.policy import CheckpointConfig
from pipelines import PIPELINES, MathChatConfig, PipelineConfig
from pipelines.base import RunFacts, no_blind_rubric
from tasks.advantages import ESTIMATORS
from tasks.algorithm import AlgorithmConfig
from tasks.coach import CoachConfig


class RolloutConfig(BaseModel):
    """How many episodes an iteration plays and how they are sampled."""

    model_config = ConfigDict(extra="forbid")

    questions: int = Field(8, ge=1, description="training questions per iteration")
    group_size: int = Field(4, ge=1, description="episodes per question (the group of GRPO / RLOO)")
    temperature: float = Field(
        1.0,
        ge=0.01,  # vLLM samples anything lower at 0.01, so its log-probs would not be of this temperature
        le=2,  # vLLM's SamplingParams refuses more (vLLM >= 0.24)
        description="sampling temperature of training rollouts; "
        "log-probs (policy, reference, training) are of softmax(logits / T)",
    )
    eval_questions: int | None = Field(None, ge=1, description="held-out questions per evaluation (None: all)")
    eval_samples: int = Field(
        0, ge=0, le=64, description="sampled episodes per held-out question for pass@k (0: greedy only)"
    )
    max_infra_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="stop the run when more than this share of a "
        "partition's actions are left unscored by infrastructure faults (a sandbox that "
        "would not start, a tool backend or scorer that failed after its retries)",
    )


class RunSettings(BaseModel):
    """Where a run's files and tracking go."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field("runs", description="folder holding one sub-folder per run (and the MLflow database)")
    id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="run id (default: `<preset>-<timestamp>-<random>`)",
    )
    experiment: str = Field("teamrl", min_length=1, description="MLflow experiment name")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: `sqlite:///<dir>/mlflow.db`)")
    mlflow: bool = Field(True, description="log params, metrics and adapters to MLflow")
    mlflow_parent: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{32}$",
        description="MLflow run id this run's MLflow run nests under (`teamrl sweep` sets it to the sweep's run)",
    )
    traces: Literal["none", "sample", "all"] = Field(
        "sample",
        description="episodes written as MLflow traces, each turn a span with the coach's verdict as feedback "
        "(infra/traces.py): `sample` every held-out episode and `trace_sample` training episodes per "
        "iteration, `all` every episode, `none` no trace",
    )
    trace_sample: int = Field(8, ge=0, description="training episodes traced per iteration with traces=sample")
    registry: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$",
        description="register each agent's final checkpoint as MLflow model "
        "`<registry>-<agent>` with alias `best` (default: the preset name)",
    )


class RunConfig(BaseModel):
    """Everything a training run needs; the resolved copy is saved as `runs/<run_id>/config.yaml`."""

    model_config = ConfigDict(extra="forbid")

    preset: str = Field("custom", description="name of the preset this config came from")
    seed: int = Field(0, ge=0, description="the same seed gives the same tables on the same CPU type and thread count")
    iterations: int = Field(2, ge=0, le=100000, description="training iterations")
    evaluate: bool = Field(
        True, description="evaluate on the held-out split before the first and after the last iteration"
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="with `evaluate`, also evaluate after every this-many iterations "
        "(0: only before the first and after the last), for held-out learning curves",
    )
    run: RunSettings = Field(default_factory=RunSettings)
    plugins: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the rest of the config is read; each registers its own "
        "pipelines, estimators, losses or engines (docs/guides/extending.md). Saved with the run, so a "
        "resume, an evaluation or a Ray worker imports them too",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    pipeline: PipelineConfig = Field(default_factory=MathChatConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    coach: CoachConfig = Field(default_factory=CoachConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    engines: EnginesConfig = Field(default_factory=EnginesConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, raw):
        modules = raw.get("plugins") if isinstance(raw, dict) else None
        for module in modules if isinstance(modules, list) else ():  # other types: the field's error
            try:
                importlib.import_module(str(module))
            except ImportError as e:
                raise ValueError(f"plugins: cannot import {module!r}: {e}") from None
        return moved_to_pipeline(raw) if isinstance(raw, dict) else raw

    @model_validator(mode="after")
    def _engines_fit_the_model(self):
        e, m = self.engines, self.model
        if e.generation == "vllm" and m.weights != "lora":
            raise ValueError("engines.generation=vllm serves one LoRA adapter per agent: it needs model.weights=lora")
        if e.generation == "vllm" and m.name == "tiny":
            raise ValueError(
                "engines.generation=vllm cannot serve model.name=tiny (a random model that exists only "
                "in memory): name a Hugging Face model, a local folder or smollm2-135m-instruct"
            )
        if e.trainer == "deepspeed" and e.device == "cpu":
            raise ValueError("engines.trainer=deepspeed runs on a GPU: set engines.device=cuda")
        if e.train_ranks > 1 and (e.trainer != "torch" or e.device != "cpu"):
            raise ValueError(
                "engines.train_ranks > 1 runs the torch trainer on CPU (gloo) only for now: set "
                "engines.trainer=torch and engines.device=cpu, or engines.train_ranks=1"
            )
        return self

    @model_validator(mode="after")
    def _coach_fits_the_pipeline(self):
        c = self.coach
        if c.backend == "rubric" and not c.ground_truth and not PIPELINES[self.pipeline.name].answer_blind_rubric:
            raise ValueError(no_blind_rubric(self.pipeline.name))
        a = self.algorithm
        facts = RunFacts(c.backend, a.estimator, ESTIMATORS.traits(a.estimator).trajectory)
        PIPELINES[self.pipeline.name].check_config(self.pipeline, facts)
        return self


# `algorithm` keys that became the pipeline's own (a dual-system team's), as configs saved before still have them
MOVED_TO_PIPELINE = ("balance", "system1_credit")


def moved_to_pipeline(raw: dict) -> dict:
    """`raw` with each MOVED_TO_PIPELINE key of its `algorithm` section moved into `pipeline` where the
    pipeline's config has that field (and does not set it), else dropped: a saved config.yaml lists every
    default, and a pipeline without the field never used it."""
    algorithm, pipeline = raw.get("algorithm"), raw.get("pipeline", {})
    if not isinstance(algorithm, dict) or not isinstance(pipeline, dict) or not set(MOVED_TO_PIPELINE) & set(algorithm):
        return raw
    name = pipeline.get("name", "mathchat")
    fields = PIPELINES[name].Config.model_fields if name in PIPELINES else {}
    algorithm, pipeline = dict(algorithm), dict(pipeline)
    for key in MOVED_TO_PIPELINE:
        if key in algorithm:
            value = algorithm.pop(key)
            if key in fields:
                pipeline.setdefault(key, value)
    return raw | {"algorithm": algorithm, "pipeline": pipeline}


class ConfigError(TeamrlError, ValueError):
    """A config problem; the message names the field."""


T = TypeVar("T", bound=BaseModel)


def format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        got = (
            f" (got {err['input']!r})"
            if err["type"] != "extra_forbidden" and "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        if not where:  # a check across sections: its message names the fields
            lines.append(msg.removeprefix("Value error, "))
            continue
        lines.append(f"{where}: {msg}{got}")
    return "invalid config: " + "; ".join(lines)


def validate(raw: dict, model: type[T]) -> T:
    """`raw` as a `model` (a RunConfig, or one section); a ConfigError naming the bad fields."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None
