"""What a task knows about its run: `RunContext`, the run folder opened once, with its typed config, its
pipeline and problems, and the engines built for it.

The flow that runs a run opens its context (`with RunContext(run_dir) as run:`) and passes it to every stage
with iteration / phase / versions, so the engines load once per flow and no model or tensor crosses a task
boundary in the store's place: a stage reads and writes partitions. Leaving the `with` closes the engines
(the generation engine, the Ray actors and their placement group, the model), which is what a Prefect
worker serving run after run needs. A process that works on a run outside a flow (a training rank, a Ray
rollout actor, a report) opens its own.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from infra.errors import UsageError
from tasks.config import RunConfig, validate

IDENTITY = ("run_id", "nonce", "flow_run_id")  # a run folder's own: never copied to another folder
# what config.yaml holds beside the RunConfig: the identity, and an evaluation folder's records (flows/evaluate.py)
RUN_KEYS = (*IDENTITY, "problems", "source")


def stage_seed(seed: int, *parts) -> int:
    """A 31-bit seed derived from the run seed and a stage's identity (iteration, phase, agent, ...)."""
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def user_problems(file: str | Path, docs: str | Path | None) -> dict:
    """The config section `problems` of a `teamrl eval --problems` folder: the user's files (absolute)
    and their SHA-256, so that the folder's held-out split is known to be the file it was made from."""
    files = {"file": Path(file).resolve(), "docs": Path(docs).resolve() if docs else None}
    return {k: str(p) if p else None for k, p in files.items()} | {
        "sha256": {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items() if p}
    }


class RunContext:
    """One run folder opened: `config` (the saved RunConfig), `run_id`, `nonce`, the pipeline, and the
    engines (`policy`, `generation_engine()`, `rollout_workers(...)`, `trainer()`), each built on first use
    and kept until `close()`."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = str(run_dir)
        p = Path(run_dir) / "config.yaml"
        if not p.exists():
            raise FileNotFoundError(f"{run_dir} is not a teamrl run folder (no config.yaml)")
        raw = yaml.safe_load(p.read_text())
        self.run_id: str = raw["run_id"]
        self.nonce: str = raw["nonce"]
        self.user_problems: dict | None = raw.get("problems")
        self.config = validate({k: v for k, v in raw.items() if k not in RUN_KEYS}, RunConfig)
        self._generation: Any = None
        self._workers: Any = None

    def seed_for(self, *parts) -> int:
        """The seed of a stage's randomness: the run seed and the stage's identity."""
        return stage_seed(self.config.seed, *parts)

    @cached_property
    def pipeline(self):
        from pipelines import build_pipeline

        return build_pipeline(self.config.pipeline, self.config.seed)

    @property
    def weights(self) -> dict[str, str]:
        """Role -> the weights unit that plays it (the pipeline's `weights`)."""
        return self.pipeline.weights

    @property
    def units(self) -> list[str]:
        """The team's weights units: what is built, updated, checkpointed, versioned and registered."""
        from pipelines.base import weight_units

        return weight_units(self.weights)

    def roles_of(self, unit: str) -> list[str]:
        """The roles weights `unit` plays."""
        return [r for r, w in self.weights.items() if w == unit]

    def problems(self, split: str) -> list:
        """The pipeline's problems of `split`; in a `teamrl eval --problems` folder the held-out split is the
        user's file, refused if it changed since the folder was made."""
        user = self.user_problems
        if split != "eval" or not user:
            return self.pipeline.problems(split)
        if (now := user_problems(user["file"], user["docs"])) != user:
            changed = [user[k] for k in user["sha256"] if now["sha256"][k] != user["sha256"][k]]
            raise UsageError(
                f"{', '.join(changed)} changed since {self.run_dir} was made from it: evaluate it again with "
                "`teamrl eval RUN --problems FILE`, which makes a new folder"
            )
        return self.pipeline.load_problems(user["file"], user["docs"])

    @cached_property
    def policy(self):
        """The team's TeamPolicy over its weights units. Building it sets this process's torch threads
        (`engines.threads`), since the engines that follow run on them."""
        from infra.policy import TeamPolicy

        cfg = self.config
        if cfg.engines.threads:
            import torch

            torch.set_num_threads(cfg.engines.threads)
        return TeamPolicy(cfg.model, self.units, seed=cfg.seed, device=cfg.engines.device, roles=self.weights)

    def generation_engine(self):
        """The generation engine (`engines.generation`, infra/engines/); call `use(run_dir, versions)` on it
        before generating."""
        if self._generation is None:
            from infra.engines import engine_class

            cfg = self.config
            cls = engine_class("generation", cfg.engines.generation)
            self._generation = cls(self.policy, cfg.model, cfg.engines, list(self.policy.agents), cfg.seed)
        return self._generation

    def release_generation(self) -> None:
        """Let a built generation engine give up accelerator memory while the trainer works (vLLM's sleep
        mode; a no-op otherwise). Builds nothing."""
        if self._generation is not None:
            self._generation.sleep()

    def rollout_workers(self, open_player):
        """The Ray rollout actors of `engines.ray` (infra/engines/ray_rollouts.py), placed on first use, each
        playing with `open_player(run_dir)`."""
        if self._workers is None:
            from infra.engines.ray_rollouts import RolloutActors

            self._workers = RolloutActors(self.config.engines.ray, open_player, self.run_dir)
        return self._workers

    def trainer(self):
        """The trainer (`engines.trainer`, infra/engines/)."""
        from infra.engines import engine_class

        return engine_class("trainer", self.config.engines.trainer)(self.config.engines)

    def cache_key(self, done: bool, *parts) -> str | None:
        """Deterministic per (run instance, iteration, stage, agent), so a rerun of a failed run hits it.

        The store is the authority: while the stage's output partition is absent (never written, or
        removed by hand) there is no key, so Prefect cannot serve a stale result for it.
        """
        if not done:
            return None
        return ":".join(["teamrl", self.run_id, self.nonce] + [str(p) for p in parts])

    def close(self) -> None:
        """Release the engines: the generation engine's memory, the Ray actors and their placement group,
        the model."""
        if self._generation is not None:
            self._generation.close()
        if self._workers is not None:
            self._workers.close()
        self._generation = self._workers = None
        self.__dict__.pop("policy", None)

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def __repr__(self) -> str:  # what Prefect shows of a stage's or sub-flow's `run` parameter
        return f"RunContext({self.run_dir!r})"
