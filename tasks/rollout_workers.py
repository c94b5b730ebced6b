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

from infra.engines.config import RayConfig
from tasks import context
from tasks.acting import TeamActs

_WORKERS: dict[tuple, list] = {}


def shards(groups: list[str], n: int) -> list[range]:
    """Split episode indices into at most n contiguous ranges of whole groups (sizes differ by <= 1 group)."""
    starts = [i for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    k = min(n, len(starts))
    bounds = [starts[(j * len(starts)) // k] for j in range(k)] + [len(groups)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def workers(cfg: RayConfig) -> list:
    """The rollout actors for `cfg` (created once per process, placed by a placement group)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    key = tuple(sorted(cfg.model_dump().items()))
    if key in _WORKERS:
        return _WORKERS[key]
    if not ray.is_initialized():
        ray.init(
            address=None if cfg.address == "local" else cfg.address,
            namespace="teamrl",
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
        )
    bundle = {"CPU": cfg.cpus_per_worker} | ({"GPU": cfg.gpus_per_worker} if cfg.gpus_per_worker else {})
    pg = placement_group([bundle] * cfg.rollout_workers, strategy=cfg.placement.upper())
    ray.get(pg.ready(), timeout=300)
    actor = ray.remote(RolloutWorker)
    _WORKERS[key] = [
        actor.options(
            num_cpus=cfg.cpus_per_worker,
            num_gpus=cfg.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
        ).remote()
        for i in range(cfg.rollout_workers)
    ]
    return _WORKERS[key]


def placement() -> list[str]:
    """The Ray node id of every live rollout actor of this process, in worker order."""
    import ray

    return [ray.get(w.node.remote()) for ws in _WORKERS.values() for w in ws]


def play_on_ray(
    cfg: RayConfig,
    run_dir: str,
    versions: dict[str, int],
    problems: list,
    episode_ids: list[str],
    group_ids: list[str],
    temperature: float,
    greedy: bool,
    seed_parts: tuple,
) -> list:
    """The episodes of `problems`, played shard by shard on the rollout actors, in the input order."""
    import ray

    ws = workers(cfg)
    parts = shards(group_ids, len(ws))
    futures = [
        w.play.remote(
            run_dir,
            versions,
            problems[r.start : r.stop],
            episode_ids[r.start : r.stop],
            group_ids[r.start : r.stop],
            temperature,
            greedy,
            seed_parts + (j,),
        )
        for j, (w, r) in enumerate(zip(ws, parts))
    ]
    return [e for eps in ray.get(futures) for e in eps]


class RolloutWorker:
    """A Ray actor holding the team (tasks/context.py's engines, loaded once) that plays episodes."""

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
        pipe = context.pipeline(run_dir)
        engine = context.generation_engine(run_dir)
        engine.use(run_dir, versions)
        act = TeamActs(
            engine,
            context.policy(run_dir).tokenizer,
            pipe,
            temperature,
            greedy,
            lambda n=1: None,
            lambda agent, n: context.stage_seed(*seed_parts, agent, n),
            in_flow=False,
        )
        return pipe.run_episodes(problems, episode_ids, group_ids, act)
