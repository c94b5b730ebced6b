"""Training ranks (`engines.train_ranks`): the calling process is rank 0, and ranks 1..N-1 are fresh
processes joined with it in one gloo process group: on this machine (`spawn_ranks`, torch.multiprocessing's
`spawn`) or as Ray actors on a cluster (`ray_ranks`, placed by a placement group).

The group lives for one update: the helpers load the team's model themselves (they receive the run folder,
iteration, phase and agent, never tensors), train on their share of each minibatch (the same replica of
LoRA adapters; full weights sharded, infra/sharded.py), and exit; rank 0 keeps the result and writes the
checkpoint as a one-rank update does. A rank that raises or dies fails the update with an error naming it,
every helper is stopped, and nothing is written, so the task's retry or `--resume` redoes the update.
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.errors import TeamrlError

INIT_TIMEOUT_S = 600  # helpers import torch and load the model before they join the group


class RankFailed(TeamrlError):
    """A training rank raised or died; the update is not recorded."""

    resumable = True


def _join(host: str, port: int, rank: int, world: int) -> None:
    """Join the update's gloo group as `rank`, rank 0 listening on host:port."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S),
    )
    # gloo's init returns on a rank once its own links are up, not once every pair of peers is linked: rank
    # 0 (which hosts the rendezvous store) could run an update with no collective in it (a skipped agent),
    # close the group and cut off helpers still linking to each other, which then fail under load
    dist.barrier()


def _helper(rank: int, world: int, port: int, threads: int, error_dir: str, target: Callable, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        _join("127.0.0.1", port, rank, world)
        target(*args, rank=rank, world=world)
    except BaseException as e:
        Path(error_dir, f"rank-{rank}").write_text("".join(traceback.format_exception_only(type(e), e)).strip())
        os._exit(1)  # skip interpreter teardown: the group's threads may still hold its peers' sockets
    dist.destroy_process_group()


def _failure(helpers: list, error_dir: Path) -> str | None:
    """Which helper failed and why, once every helper has ended (or been stopped)."""
    for rank, p in enumerate(helpers, start=1):
        if p.exitcode not in (0, None):
            f = error_dir / f"rank-{rank}"
            why = f.read_text() if f.exists() else f"exit code {p.exitcode}"
            return f"training rank {rank} of {len(helpers) + 1} failed: {why}"
    return None


def _stop(helpers: list) -> None:
    for p in helpers:
        if p.is_alive():
            p.kill()
        p.join()


@contextmanager
def spawn_ranks(world: int, threads: int, target: Callable, args: tuple) -> Iterator[None]:
    """Ranks 1..world-1 run `target(*args, rank=r, world=world)` in processes of their own while the body runs
    as rank 0 of the same gloo group, each rank with `threads` torch threads."""
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from infra.engines.zero import free_port

    port, ctx = free_port(), mp.get_context("spawn")
    saved_threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="teamrl-ranks-") as tmp:
        errors = Path(tmp)
        helpers = [
            ctx.Process(target=_helper, args=(r, world, port, threads, tmp, target, args), daemon=True)
            for r in range(1, world)
        ]
        for p in helpers:
            p.start()
        torch.set_num_threads(threads)
        try:
            _join("127.0.0.1", port, 0, world)
            try:
                yield
            except BaseException as e:
                # a helper that died broke the collective this rank was in: it has exited (or is exiting),
                # while a healthy one waits in the group; so a helper's failure seen now came first
                for p in helpers:
                    p.join(timeout=2)
                if isinstance(e, Exception) and (why := _failure(helpers, errors)) is not None:
                    raise RankFailed(why) from e
                raise  # this rank's own error, or Ctrl-C (which the helpers got too)
            finally:
                dist.destroy_process_group()
            for p in helpers:
                p.join()
            if (why := _failure(helpers, errors)) is not None:
                raise RankFailed(why)
        finally:
            _stop(helpers)
            torch.set_num_threads(saved_threads)


class RankActor:
    """Ranks 1..N-1 on a Ray cluster: one actor per rank, for one update."""

    def run(self, rank: int, world: int, host: str, port: int, threads: int, target: Callable, args: tuple):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        _join(host, port, rank, world)
        try:
            target(*args, rank=rank, world=world)
        finally:
            dist.destroy_process_group()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def _ray_failure(futures: list, wait_s: float) -> str | None:
    """The first rank whose call ended in an error within `wait_s` seconds, and why."""
    import ray

    done, _ = ray.wait(futures, num_returns=len(futures), timeout=wait_s)
    for rank, f in enumerate(futures, start=1):
        if f in done:
            try:
                ray.get(f)
            except Exception as e:  # the rank's own error, or its actor's death
                cause = getattr(e, "cause", None) or e
                return f"training rank {rank} of {len(futures) + 1} failed: {type(cause).__name__}: {cause}"
    return None


@contextmanager
def ray_ranks(world: int, threads: int, target: Callable, args: tuple, cfg) -> Iterator[list[str]]:
    """As `spawn_ranks`, with ranks 1..world-1 as Ray actors on the cluster of `cfg` (infra/engines/config.py
    RayConfig), placed by `cfg.placement`; yields the Ray node id of each of those ranks."""
    import ray
    import torch
    import torch.distributed as dist
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from infra.engines.zero import free_port

    if not ray.is_initialized():
        ray.init(address=None if cfg.address == "local" else cfg.address, namespace="teamrl", log_to_driver=False)
    group = placement_group([{"CPU": cfg.cpus_per_rank}] * (world - 1), strategy=cfg.placement.upper())
    ray.get(group.ready(), timeout=300)
    actor = ray.remote(RankActor)
    actors: list[Any] = [
        actor.options(
            num_cpus=cfg.cpus_per_rank, scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)
        ).remote()
        for i in range(world - 1)
    ]
    host, port = ray.util.get_node_ip_address(), free_port()
    saved_threads = torch.get_num_threads()
    try:
        nodes = ray.get([a.node.remote() for a in actors])
        futures = [a.run.remote(r, world, host, port, threads, target, args) for r, a in enumerate(actors, start=1)]
        torch.set_num_threads(threads)
        _join(host, port, 0, world)
        try:
            yield nodes
        except BaseException as e:
            # as in spawn_ranks: a rank whose call already ended in an error broke this rank's collective
            if isinstance(e, Exception) and (why := _ray_failure(futures, 2.0)) is not None:
                raise RankFailed(why) from e
            raise
        finally:
            dist.destroy_process_group()
        if (why := _ray_failure(futures, INIT_TIMEOUT_S)) is not None:
            raise RankFailed(why)
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(group)
        torch.set_num_threads(saved_threads)
