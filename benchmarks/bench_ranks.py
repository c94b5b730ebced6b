"""Training ranks (`engines.train_ranks`, infra/ranks.py): one agent's update of the demo preset on
2 ranks x 1 torch thread against 1 rank x 2 threads, and what starting the ranks costs.

    .venv/bin/python -m benchmarks.bench_ranks [--quick]

A run folder of the preset (`mathchat-smol`; `--quick`: `tiny`) gets one iteration's rollout partition,
coach scores and advantages (the real stages, played once). Then the executor's update (the agent
with the longest samples) is trained from the same weights, the two ways alternately, `repeats` times
each: the update as the `update` task runs it (the batch read from the run folder, the configured loss
and spec), without the trust-region and certificate measurements, which rank 0 does alone either way.
The 2-rank time includes starting rank 1 (a process, its imports, the model's load); that start alone
is measured by ranks that load the model and train nothing. On a machine with 2 cores, 2 ranks x 1
thread do the work of 1 rank x 2 threads, so a speedup is not expected: the figure is what starting and
synchronising ranks costs, and the equivalence of the two ways is tested in tests/test_ranks.py.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import Section

AGENT = "executor"


def _prepared(root: Path, preset: str):
    """An opened run (a RunContext) whose iteration 1 is played, scored and has its advantages."""
    from benchmarks.bench_orchestration import new_run, without_task_runs
    from tasks.coach_evaluate import coach_evaluate
    from tasks.collect_rollouts import collect_rollouts
    from tasks.compute_advantages import compute_advantages
    from tasks.context import RunContext

    ctx = RunContext(new_run(root, "ranks", preset))
    with without_task_runs():
        collect_rollouts(ctx, 1, "rollout", {r: 0 for r in ctx.weights})
        coach_evaluate(ctx, 1, "rollout")
        compute_advantages(ctx, 1, "rollout")
    return ctx


def _load_only(run_dir: str, rank: int, world: int) -> None:
    from tasks.context import RunContext

    with RunContext(run_dir) as ctx:
        ctx.policy.load(run_dir, AGENT, 0)


def run(quick: bool = False) -> Section:
    import torch

    from infra.ranks import spawn_ranks
    from tasks.update import batch_of, loss_of, spec_of, train_rank

    preset, repeats = ("tiny", 1) if quick else ("mathchat-smol", 3)
    threads = 2
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp, _prepared(Path(tmp), preset) as ctx:
        rd, policy = ctx.run_dir, ctx.policy
        policy.load(rd, AGENT, 0)
        with policy.materialized(AGENT):
            start = [p.detach().clone() for p in policy.parameters(AGENT)]
        items, _ = batch_of(ctx, 1, "rollout", AGENT)

        def update(world: int) -> float:
            with torch.no_grad(), policy.materialized(AGENT, modify=True):
                for p, s in zip(policy.parameters(AGENT), start):
                    p.copy_(s)
            spec = spec_of(ctx, 1, "rollout", AGENT, 0, world=world)
            t0 = time.perf_counter()
            if world == 1:
                saved = torch.get_num_threads()  # the caller's (a test session's) thread count is left as it was
                torch.set_num_threads(threads)
                try:
                    ctx.trainer().train(policy, AGENT, items, loss_of(ctx), spec)
                finally:
                    torch.set_num_threads(saved)
            else:
                with spawn_ranks(world, threads // world, train_rank, (rd, 1, "rollout", AGENT, 0)):
                    ctx.trainer().train(policy, AGENT, items, loss_of(ctx), spec)
            return time.perf_counter() - t0

        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeats):
            for world in (1, 2):
                times[world].append(update(world))
        starts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with spawn_ranks(2, 1, _load_only, (rd,)):
                pass
            starts.append(time.perf_counter() - t0)
    one, two, start_s = (statistics.median(t) for t in (times[1], times[2], starts))
    tokens = sum(sum(it.mask) for it in items)
    return Section(
        title="Training ranks: 2 ranks x 1 thread against 1 rank x 2 threads",
        command=f".venv/bin/python -m benchmarks.bench_ranks{' --quick' if quick else ''}",
        rows=[
            {"ranks x threads": "1 x 2", "s / update": one, "samples": len(items), "trained tokens": tokens},
            {"ranks x threads": "2 x 1", "s / update": two, "samples": len(items), "trained tokens": tokens},
            {"ranks x threads": "2 x 1, start only", "s / update": start_s, "samples": 0, "trained tokens": 0},
        ],
        notes=[
            f"**2 ranks / 1 rank, time of one update: {two / one:.2f}** (no target: see below).",
            f"{preset}, the {AGENT}'s update of iteration 1 ({len(items)} samples, {tokens} trained tokens); "
            f"medians of {repeats} updates per way, alternating. The 2-rank time includes starting rank 1 "
            f"(the 'start only' row: a process, its imports and the model's load, ~{start_s:.1f} s), which "
            "the ranks pay per update because they live for one update (docs/guides/gpus-and-ray.md).",
            "On 2 cores no speedup is expected (the same 2 cores do the work either way); with one GPU per "
            "rank the gradient work divides by the ranks and the all-reduce of the trained weights' "
            "gradients is added per step (an estimate, not measured here).",
        ],
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    print(run(ap.parse_args().quick).markdown())
