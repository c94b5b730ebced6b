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

The actors know nothing of teams: each opens the run once with the `open_player(run_dir)` it was given
(tasks/collect_rollouts.py's ShardPlayer, shipped by reference) and hands every shard to that player.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infra.engines.config import RayConfig


def shards(groups: list[str], n: int) -> list[range]:
    """Split episode indices into at most n contiguous ranges of whole groups (sizes differ by <= 1 group)."""
    starts = [i for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    k = min(n, len(starts))
    bounds = [starts[(j * len(starts)) // k] for j in range(k)] + [len(groups)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class RolloutActors:
    """The rollout actors of one run (`RunContext.rollout_workers`), placed by a placement group, each
    playing with `open_player(run_dir)`; `close` kills them and frees the group's resources."""

    def __init__(self, cfg: RayConfig, open_player: Callable[[str], Any], run_dir: str):
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
            ).remote(open_player, run_dir)
            for i in range(cfg.rollout_workers)
        ]

    def placement(self) -> list[str]:
        """The Ray node id of every actor, in worker order."""
        import ray

        return [ray.get(a.node.remote()) for a in self.actors]

    def play(self, group_ids: list[str], shard_args: Callable[[range, int], tuple]) -> list:
        """The episodes of every shard of whole groups, played on the actors and gathered in input order:
        actor j plays `player.play(*shard_args(indices, j))`."""
        import ray

        parts = shards(group_ids, len(self.actors))
        futures = [a.play.remote(*shard_args(r, j)) for j, (a, r) in enumerate(zip(self.actors, parts))]
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
    """A Ray actor that plays shards with the player it opens for its run on first use (the engines load once)."""

    def __init__(self, open_player: Callable[[str], Any], run_dir: str):
        self.open_player, self.run_dir = open_player, run_dir
        self.player: Any = None

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def play(self, *args) -> list:
        if self.player is None:
            self.player = self.open_player(self.run_dir)
        return self.player.play(*args)
