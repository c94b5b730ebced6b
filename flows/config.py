"""The run config: each component's own pydantic model composed into one, loaded from a YAML preset
and overridden with `--set key=value`. Errors name the field and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.engines.config import EnginesConfig
from infra.errors import TeamrlError
from infra.models import ModelConfig
from infra.policy import CheckpointConfig
from pipelines import PIPELINES, MathChatConfig, PipelineConfig
from pipelines.base import no_blind_rubric
from tasks.algorithm import AlgorithmConfig
from tasks.coach import CoachConfig
from tasks.collect_rollouts import RolloutConfig

PRESETS = Path(__file__).parent / "presets"


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
    seed: int = Field(0, ge=0, description="the same seed gives the same tables")
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
    model: ModelConfig = Field(default_factory=ModelConfig)
    pipeline: PipelineConfig = Field(default_factory=MathChatConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    coach: CoachConfig = Field(default_factory=CoachConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    engines: EnginesConfig = Field(default_factory=EnginesConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

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
        return self

    @model_validator(mode="after")
    def _coach_fits_the_pipeline(self):
        c = self.coach
        if c.backend == "rubric" and not c.ground_truth and not PIPELINES[self.pipeline.name].answer_blind_rubric:
            raise ValueError(no_blind_rubric(self.pipeline.name))
        return self


class ConfigError(TeamrlError, ValueError):
    """A config problem; the message names the field."""


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _set(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: `{k}` is a value, not a section")
        d = nxt
    d[keys[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any, str]]:
    """(key, YAML-parsed value, raw text) per `key=value`."""
    out = []
    for it in items:
        if "=" not in it or not it.split("=", 1)[0].strip():
            raise ConfigError(f"override {it!r}: expected key=value, e.g. --set seed=3")
        k, v = it.split("=", 1)
        try:
            val = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            val = v
        out.append((k.strip(), val, v))
    return out


def _format(e: ValidationError) -> str:
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


T = TypeVar("T", bound=BaseModel)


def validate(raw: dict, model: type[T] = RunConfig) -> T:
    """`raw` as a `model` (the run config by default); a ConfigError naming the bad fields."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


def load_config(preset: str, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset by name (flows/presets/<name>.yaml) or a YAML path, then apply overrides."""
    path = Path(preset)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PRESETS / f"{preset}.yaml"
        if not path.exists():
            raise ConfigError(f"no preset or YAML file {preset!r}; presets: {', '.join(preset_names())}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    raw.setdefault("preset", path.stem)
    parsed = parse_overrides(overrides or [])
    for k, v, _ in parsed:
        _set(raw, k, v)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        # `--set run.id=123` means the text "123" where the field is a string: retry those as text
        texts = {".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "string_type"}
        retry = [(k, t) for k, v, t in parsed if k in texts and not isinstance(v, str)]
        if not retry:
            raise ConfigError(_format(e)) from None
        for k, t in retry:
            _set(raw, k, t)
        return validate(raw)
