"""`engines.runner: ray`: rollouts played by long-lived Ray actors, one rollout worker per bundle of a
placement group spread over the cluster's nodes.

Why actors called from the `collect_rollouts` task, not prefect-ray's RayTaskRunner: a RayTaskRunner
ships each *task* to whichever Ray worker is free, so every stage would load the team's model again in
a fresh process (our engines live for a whole run, tasks/context.py), and the DAG is a chain of stages
that gains nothing from running tasks in parallel; what parallelises is the episodes inside one stage.
So the flow keeps Prefect's local runner (caching, retries, resume are unchanged) and `collect_rollouts`
shards its episodes over the actors, gathers them in order and writes the partition itself. The run
folder must be on storage every node sees (one machine, NFS, a mounted bucket): actors read the
checkpoints from it.

Each shard is whole GRPO groups and has its own sampling seed (run seed, stage, shard), so a run is
reproducible for a given number of workers; it differs from the local runner's samples, whose seed
covers one batch of all episodes.
"""

from __future__ import annotations

from typing import Any

from infra.engines.config import RayConfig
from tasks import context
from tasks.acting import TeamActs


def shards(groups: list[str], n: int) -> list[range]:
    """Split episode indices into at most n contiguous ranges of whole groups (sizes differ by <= 1 group)."""
    starts = [i for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    k = min(n, len(starts))
    bounds = [starts[(j * len(starts)) // k] for j in range(k)] + [len(groups)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class RolloutActors:
    """The rollout actors of one run (`RunContext.rollout_workers()`), placed by a placement group; `close`
    kills them and frees the group's resources."""

    def __init__(self, cfg: RayConfig):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init(
                address=None if cfg.address == "local" else cfg.address,
                namespace="teamrl",
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=False,
            )
        bundle = {"CPU": cfg.cpus_per_worker} | ({"GPU": cfg.gpus_per_worker} if cfg.gpus_per_worker else {})
        self.group = placement_group([bundle] * cfg.rollout_workers, strategy=cfg.placement.upper())
        ray.get(self.group.ready(), timeout=300)
        actor = ray.remote(RolloutWorker)
        self.actors: list[Any] = [
            actor.options(
                num_cpus=cfg.cpus_per_worker,
                num_gpus=cfg.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, i),
            ).remote()
            for i in range(cfg.rollout_workers)
        ]

    def placement(self) -> list[str]:
        """The Ray node id of every actor, in worker order."""
        import ray

        return [ray.get(a.node.remote()) for a in self.actors]

    def play(
        self,
        run_dir: str,
        versions: dict[str, int],
        problems: list,
        episode_ids: list[str],
        group_ids: list[str],
        temperature: float,
        greedy: bool,
        seed_parts: tuple,
    ) -> list:
        """The episodes of `problems`, played shard by shard on the actors, in the input order."""
        import ray

        parts = shards(group_ids, len(self.actors))
        futures = [
            a.play.remote(
                run_dir,
                versions,
                problems[r.start : r.stop],
                episode_ids[r.start : r.stop],
                group_ids[r.start : r.stop],
                temperature,
                greedy,
                seed_parts + (j,),
            )
            for j, (a, r) in enumerate(zip(self.actors, parts))
        ]
        return [e for eps in ray.get(futures) for e in eps]

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():  # disconnected: the actors went with the connection (and a call would start Ray)
            return
        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.group)
        self.actors = []


class RolloutWorker:
    """A Ray actor that plays episodes with the team of its run (`context.of`: the engines load once)."""

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def play(
        self,
        run_dir: str,
        versions: dict[str, int],
        problems: list,
        episode_ids: list[str],
        group_ids: list[str],
        temperature: float,
        greedy: bool,
        seed_parts: tuple,
    ) -> list:
        ctx = context.of(run_dir)
        pipe, engine = ctx.pipeline, ctx.generation_engine()
        engine.use(run_dir, versions)
        act = TeamActs(
            engine,
            ctx.policy.tokenizer,
            pipe,
            temperature,
            greedy,
            lambda n=1: None,
            lambda agent, n: context.stage_seed(*seed_parts, agent, n),
            in_flow=False,
        )
        return pipe.run_episodes(problems, episode_ids, group_ids, act)
