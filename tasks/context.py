"""What a task knows about its run: the run folder, its resolved config, and the long-lived engines.

Tasks receive `run_dir` (a string) plus iteration / phase / versions, and look everything else up
here, so no model or tensor ever crosses a task boundary and the engines load once per process.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from infra.engines.types import GenerationEngine
from infra.errors import UsageError

T = TypeVar("T", bound=BaseModel)


def stage_seed(seed: int, *parts) -> int:
    """A 31-bit seed derived from the run seed and a stage's identity (iteration, phase, agent, ...)."""
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


@lru_cache(maxsize=8)
def _raw(run_dir: str) -> dict:
    p = Path(run_dir) / "config.yaml"
    if not p.exists():
        raise FileNotFoundError(f"{run_dir} is not a teamrl run folder (no config.yaml)")
    return yaml.safe_load(p.read_text())


def forget(run_dir: str) -> None:
    """Drop the cached config (after config.yaml was rewritten)."""
    _raw.cache_clear()


def section(run_dir: str, name: str, model: type[T]) -> T:
    """One validated section of the run's resolved config."""
    return model.model_validate(_raw(str(run_dir))[name])


def value(run_dir: str, name: str):
    return _raw(str(run_dir))[name]


@lru_cache(maxsize=2)
def pipeline(run_dir: str):
    from pipelines import build_pipeline, pipeline_config

    return build_pipeline(pipeline_config(value(run_dir, "pipeline")), value(run_dir, "seed"))


def weights(run_dir: str) -> dict[str, str]:
    """Role -> the weights unit that plays it (the pipeline's `weights`)."""
    return pipeline(str(run_dir)).weights


def units(run_dir: str) -> list[str]:
    """The team's weights units: what is built, updated, checkpointed, versioned and registered."""
    from pipelines.base import weight_units

    return weight_units(weights(run_dir))


def roles_of(run_dir: str, unit: str) -> list[str]:
    """The roles weights `unit` plays."""
    return [r for r, w in weights(run_dir).items() if w == unit]


def user_problems(file: str | Path, docs: str | Path | None) -> dict:
    """The config section `problems` of a `teamrl eval --problems` folder: the user's files (absolute)
    and their SHA-256, so that the folder's held-out split is known to be the file it was made from."""
    files = {"file": Path(file).resolve(), "docs": Path(docs).resolve() if docs else None}
    return {k: str(p) if p else None for k, p in files.items()} | {
        "sha256": {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items() if p}
    }


def problems(run_dir: str, split: str) -> list:
    """The pipeline's problems of `split`; in a `teamrl eval --problems` folder the held-out split is the
    user's file, refused if it changed since the folder was made."""
    user = _raw(str(run_dir)).get("problems")
    if split != "eval" or not user:
        return pipeline(str(run_dir)).problems(split)
    if (now := user_problems(user["file"], user["docs"])) != user:
        changed = [user[k] for k in user["sha256"] if now["sha256"][k] != user["sha256"][k]]
        raise UsageError(
            f"{', '.join(changed)} changed since {run_dir} was made from it: evaluate it again with "
            "`teamrl eval RUN --problems FILE`, which makes a new folder"
        )
    return pipeline(str(run_dir)).load_problems(user["file"], user["docs"])


_POLICIES: dict[tuple, Any] = {}  # -> the TeamPolicy (infra/policy.py, imported when built)


def policy(run_dir: str):
    """The team's TeamPolicy over its weights units, built once per (model config, role -> unit map, seed)
    and reused across runs' tasks."""
    from infra.generation import EnginesConfig
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    mcfg = section(run_dir, "model", ModelConfig)
    engines = section(run_dir, "engines", EnginesConfig)
    roles = weights(run_dir)
    key = (mcfg.model_dump_json(), tuple(roles.items()), value(run_dir, "seed"), engines.device)
    if key not in _POLICIES:
        if engines.threads:
            import torch

            torch.set_num_threads(engines.threads)
        _POLICIES.clear()  # one team in memory at a time
        _POLICIES[key] = TeamPolicy(
            mcfg, units(run_dir), seed=value(run_dir, "seed"), device=engines.device, roles=roles
        )
    return _POLICIES[key]


_GENERATION: dict[tuple, GenerationEngine] = {}


def generation_engine(run_dir: str):
    """The generation engine (`engines.generation`, infra/engines/), built once per team and engine config;
    call `use(run_dir, versions)` on it before generating."""
    from infra.engines import engine_class
    from infra.generation import EnginesConfig
    from infra.models import ModelConfig

    engines = section(run_dir, "engines", EnginesConfig)
    pol = policy(run_dir)
    key = (engines.generation, engines.vllm.model_dump_json(), engines.batch_size, id(pol))
    if key not in _GENERATION:
        for old in _GENERATION.values():  # one engine at a time: a GPU engine holds memory until closed
            old.close()
        _GENERATION.clear()
        cls = engine_class("generation", engines.generation)
        _GENERATION[key] = cls(
            pol, section(run_dir, "model", ModelConfig), engines, list(pol.agents), value(run_dir, "seed")
        )
    return _GENERATION[key]


def release_generation() -> None:
    """Let a built generation engine give up accelerator memory while the trainer works (vLLM's sleep
    mode; a no-op otherwise). Builds nothing."""
    for engine in _GENERATION.values():
        engine.sleep()


def trainer(run_dir: str):
    """The trainer (`engines.trainer`, infra/engines/)."""
    from infra.engines import engine_class
    from infra.generation import EnginesConfig

    engines = section(run_dir, "engines", EnginesConfig)
    return engine_class("trainer", engines.trainer)(engines)


def prefect_cache_key(run_dir: str, done: bool, *parts) -> str | None:
    """Deterministic per (run instance, iteration, stage, agent), so a rerun of a failed run hits it.

    The store is the authority: while the stage's output partition is absent (never written, or
    removed by hand) there is no key, so Prefect cannot serve a stale result for it.
    """
    if not done:
        return None
    return ":".join(["teamrl", str(value(run_dir, "run_id")), str(value(run_dir, "nonce"))] + [str(p) for p in parts])
