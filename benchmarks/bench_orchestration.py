"""Orchestration overhead: one training iteration as the product runs it vs the same task functions in a plain loop.

    .venv/bin/python -m benchmarks.bench_orchestration [--quick] [--preset NAME --repeats 2 --warmup 0]

Two presets in turn, `tiny` (Prefect's fixed cost is largest against its short iterations) and the demo's
`mathchat-smol` (`--quick`: tiny only; `--preset`: the one named). Each with evaluate=false, in
two run folders with the same config and seed; iterations 1, 2, ... of each:

- Prefect flow + store + MLflow: what `train` does per iteration (`flows.train.train_iteration`): the
  `iteration-<k>` sub-flow (Prefect task runs with their cache keys and result settings), then the
  iteration's metrics logged to MLflow and its Prefect table artifact, against a temporary Prefect server
  (SQLite) and MLflow (SQLite in the run root).
- plain loop: the same DAG code (`flows.train.iteration_stages`) with each task call replaced by a call of the
  task's function (`without_task_runs`), its metrics read from the store; no Prefect task or flow run, no
  MLflow.

Both write the same Parquet partitions (checked: the same generated tokens). Every timed iteration is a new
one, so no stage is skipped by a cache or by the store. The two ways alternate, iteration by iteration and in
alternating order, inside one parent flow (as `train` holds its iterations), so a busy machine's changing load
shifts both alike. The parts of the overhead are also timed on their own: a no-op task run with the stages'
options, a no-op sub-flow run with and without Prefect's flow-run heartbeat, and (inside the iterations) the
Prefect API calls of the stages' progress artifacts, and the episodes written as MLflow traces (`run.traces`,
the demo's `sample`), which should stay within 1% of the demo's iteration. One-time costs (the Prefect
server's start, the model's load, the MLflow run's creation) are outside the figures and reported on their own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import prefect.artifacts
from prefect import flow, task
from prefect.tasks import Task

import flows.train
from benchmarks.common import Section, Target, median_seconds
from flows.config import load_config
from flows.train import iteration_stages, no_heartbeat, train_iteration
from infra import runs, store
from infra.tracking import Tracker
from tasks.context import RunContext
from tasks.update import NO_SCORED_ACTIONS

DEMO_PRESET = "mathchat-smol"  # what `make demo` trains
STAGES = ("collect_rollouts", "coach_evaluate", "compute_advantages", "update")
EXTRAS = ("rest of the iteration",)


def agent_names(rd: str) -> list[str]:
    return [a.name for a in RunContext(rd).pipeline.agents]


def new_run(root: Path, name: str, preset: str) -> str:
    """A run folder with version-0 checkpoints, as `train` prepares it (the first call loads the model)."""
    cfg = load_config(preset, [f"run.dir={root}", f"run.id={name}", "evaluate=false", "iterations=100"])
    rd = str(runs.create_run(root, name, cfg.model_dump(mode="json")))
    with RunContext(rd) as run:
        for a in agent_names(rd):
            run.policy.load(rd, a, 0)
            run.policy.save(rd, a, 0)
    return rd


def split(m: dict, total: float) -> dict:
    """An iteration's seconds: in all, per stage (its metrics' `seconds/*`), and the rest."""
    stages = {s: m.get(f"seconds/{s}", 0.0) for s in STAGES}
    return {"s / iteration": total} | stages | {"rest of the iteration": total - sum(stages.values())}


@task(name="noop", cache_key_fn=lambda ctx, params: None, persist_result=True)  # the stages' options
def noop_task() -> None:
    pass


@flow(name="noop")
def noop_flow() -> None:
    pass


@contextmanager
def without_task_runs():
    """While inside, calling a Prefect task calls its function: the flow's code runs unchanged, without task
    runs (a stage's own skip-if-done and writes are in its function, tasks/stage.py)."""
    call = Task.__call__
    Task.__call__ = lambda self, *args, **kwargs: self.fn(*args, **kwargs)
    try:
        yield
    finally:
        Task.__call__ = call


@contextmanager
def clocked(module, names: tuple[str, ...], spent: list[float], returned: list | None = None):
    """While inside, each call of module.<name> adds its seconds to `spent` (and its return value to
    `returned`), patched on the module, which the caller looks them up in at each call."""
    originals = {n: getattr(module, n) for n in names}

    def timer(fn):
        def timed_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                value = fn(*args, **kwargs)
                if returned is not None:
                    returned.append(value)
                return value
            finally:
                spent.append(time.perf_counter() - t0)

        return timed_call

    try:
        for n, fn in originals.items():
            setattr(module, n, timer(fn))
        yield
    finally:
        for n, fn in originals.items():
            setattr(module, n, fn)


@flow(name="bench-orchestration")
def both_ways(rd_flow: str, rd_plain: str, repeats: int, warmup: int) -> dict:
    """Iterations of the two runs, alternately; then the overhead's parts, each on its own."""
    with RunContext(rd_flow) as run_flow, RunContext(rd_plain) as run_plain:
        return alternately(run_flow, run_plain, repeats, warmup)


def alternately(run_flow: RunContext, run_plain: RunContext, repeats: int, warmup: int) -> dict:
    rd_flow = run_flow.run_dir
    cfg, agents = run_flow.config, agent_names(rd_flow)
    t0 = time.perf_counter()
    tracker = Tracker(rd_flow, cfg.run.dir, cfg.run.experiment, cfg.run.tracking_uri, cfg.model_dump(mode="json"))
    out = {"tracker_s": time.perf_counter() - t0, "flow": [], "plain": []}

    def through_prefect(k: int) -> None:
        spent: list[float] = []  # the progress artifacts' API calls, inside the stages' times
        traced: list[float] = []  # queueing the iteration's episodes for MLflow traces (run.traces)
        returned: list[int] = []  # how many episodes got a trace
        t0 = time.perf_counter()
        with (
            clocked(prefect.artifacts, ("create_progress_artifact", "update_progress_artifact"), spent),
            clocked(flows.train, ("trace_partitions",), traced, returned),
        ):
            m = train_iteration(run_flow, k, agents, cfg, tracker)
        ups = store.read_table(rd_flow, "updates", k)
        trained = int((ups["reason"] != NO_SCORED_ACTIONS).sum())  # an update with nothing to train shows no bar
        out["flow"].append(
            split(m, time.perf_counter() - t0)
            | {"progress artifacts": sum(spent), "progress calls": len(spent), "progress stages": 1 + trained}
            | {"traces": sum(traced), "traced episodes": sum(returned)}
        )

    def plain(k: int) -> None:
        t0 = time.perf_counter()
        with without_task_runs():
            m = iteration_stages(run_plain, k, agents, cfg.algorithm, cfg.seed)
        out["plain"].append(split(m, time.perf_counter() - t0))

    for k in range(1, warmup + repeats + 1):
        for way in (plain, through_prefect) if k % 2 else (through_prefect, plain):
            way(k)
    t0 = time.perf_counter()
    tracker.finish()  # waits for the trace writer's last partitions
    out["trace writer s"], out["finish s"] = tracker.trace_seconds, time.perf_counter() - t0
    out["task run"] = median_seconds(noop_task, 4 * (repeats + 1))
    out["sub-flow run"] = median_seconds(noop_flow, repeats + 1)

    def quiet_noop():  # as train_iteration runs its sub-flow, the settings switch included
        with no_heartbeat():
            noop_flow()

    out["sub-flow run, no heartbeat"] = median_seconds(quiet_noop, repeats + 1)
    return out


def same_work(a: str, b: str, iterations: int) -> bool:
    """Both runs wrote every iteration's partitions, with the same generated tokens."""
    ids = [
        store.read_table(rd, "actions").sort_values(["iteration", "episode_id", "turn"])["response_ids"]
        for rd in (a, b)
    ]
    return all(
        store.partition_exists(rd, t, k, "rollout")
        for rd in (a, b)
        for t in ("episodes", "updates")
        for k in range(1, iterations + 1)
    ) and [list(x) for x in ids[0]] == [list(x) for x in ids[1]]


def row(way: str, splits: list[dict]) -> dict:
    """The median of each column over the iterations (None where a way has no such part)."""
    return {"way": way} | {
        k: statistics.median(s[k] for s in splits) if k in splits[0] else None
        for k in ("s / iteration", *STAGES, *EXTRAS)
    }


def measure(preset: str, repeats: int, warmup: int) -> tuple[list[dict], list[Target], list[str]]:
    """One preset's two rows, its ratios, and notes on what the overhead is made of."""
    from prefect.testing.utilities import prefect_test_harness

    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="bench-orchestration-"))
    try:
        t0 = time.perf_counter()
        rd_plain = new_run(root, "plain", preset)
        model_s = time.perf_counter() - t0
        rd_flow = new_run(root, "flow", preset)
        cfg = RunContext(rd_flow).config
        task_runs = 3 + len(agent_names(rd_flow))  # collect, coach, advantages, one update per agent
        t0 = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=120):
            server_s = time.perf_counter() - t0
            out = both_ways(rd_flow, rd_plain, repeats, warmup)
        assert same_work(rd_plain, rd_flow, repeats + warmup), "the two ways did not do the same work"
    finally:
        shutil.rmtree(root, ignore_errors=True)

    f = {"preset": preset} | row("Prefect flow + store + MLflow", out["flow"][warmup:])
    p = {"preset": preset} | row("plain loop of the task functions", out["plain"][warmup:])
    calls = statistics.median(s["progress calls"] for s in out["flow"][warmup:])
    stages = statistics.median(s["progress stages"] for s in out["flow"][warmup:])
    parts = {
        f"{task_runs} task runs (a no-op one: {out['task run'] * 1000:.1f} ms)": task_runs * out["task run"],
        f"{calls:g} progress-artifact calls (for {stages:g} stages with a bar)": statistics.median(
            s["progress artifacts"] for s in out["flow"][warmup:]
        ),
        "the sub-flow run, MLflow and the artifact (flow minus plain rest of the iteration)": f["rest of the iteration"]
        - p["rest of the iteration"],
    }
    overhead = sum(parts.values())
    traces_s = statistics.median(s["traces"] for s in out["flow"][warmup:])
    traced = statistics.median(s["traced episodes"] for s in out["flow"][warmup:])
    listed = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in parts.items())
    notes = [
        (
            f"{preset} ({cfg.model.name}): an iteration plays {cfg.rollout.questions} questions x "
            f"{cfg.rollout.group_size} episodes, scores them with the {cfg.coach.backend} coach and runs an "
            f"update task for each of its {task_runs - 3} agents; medians over {repeats} iteration(s) per way after "
            f"{warmup} warm-up, the two ways "
            f"alternating (columns are medians of their own); load average {load:.1f} on {os.cpu_count()} cores at "
            "the start"
        ),
        (
            f"{preset} overhead: {f['s / iteration'] - p['s / iteration']:+.2f} s per iteration measured; its parts, "
            f"without the noise of the stages' compute: {listed} = {overhead:.2f} s, a ratio of "
            f"{1 + overhead / p['s / iteration']:.3f}"
        ),
        (
            f"{preset}: a no-op sub-flow run takes {out['sub-flow run'] * 1000:.0f} ms, "
            f"{out['sub-flow run, no heartbeat'] * 1000:.0f} ms without Prefect's flow-run heartbeat (on exit the "
            "flow engine joins the heartbeat thread, which sleeps in 1 s steps, so `train` runs its iteration "
            "sub-flows without it); the rest is the flow run's API calls; one-time, not in the figures: Prefect "
            f"server start {server_s:.1f} s, model load and first run folder {model_s:.1f} s, MLflow database and "
            f"run creation {out['tracker_s']:.1f} s"
        ),
    ]
    notes.append(
        f"{preset}: MLflow traces (`run.traces: {cfg.run.traces}`, {traced:g} episodes an iteration): choosing and "
        f"queueing them {traces_s * 1000:.0f} ms, {100 * traces_s / f['s / iteration']:.2f}% of the flow's "
        f"iteration; the tracker's writer thread wrote them in {out['trace writer s'] / (warmup + repeats):.2f} s "
        "an iteration while the next stages ran (its load is inside both ways' figures, since the ways alternate), "
        f"and the run's end waited {out['finish s']:.2f} s for the last ones"
    )
    targets = [
        Target(f"{preset}: Prefect flow / plain loop", f["s / iteration"] / p["s / iteration"], at_most=1.05),
    ] + [Target(f"{preset}: MLflow traces / flow's iteration", traces_s / f["s / iteration"], at_most=0.01)] * (
        preset == DEMO_PRESET  # the bound is against the demo's iteration; tiny's are too short to compare
    )
    return [f, p], targets, notes


# (preset, timed iterations per way, warm-up iterations): tiny's short iterations show Prefect's fixed cost
# at its largest; mathchat-smol's are the demo's (about 2 minutes each here)
PLAN = [("tiny", 5, 1), ("mathchat-smol", 2, 0)]


def run(quick: bool = False, plan: list[tuple[str, int, int]] | None = None) -> Section:
    plan = plan or ([("tiny", 1, 0)] if quick else PLAN)
    rows, targets, notes = [], [], []
    for preset, repeats, warmup in plan:
        r, t, n = measure(preset, repeats, warmup)
        rows, targets, notes = rows + r, targets + t, notes + n
    custom = plan not in (PLAN, [("tiny", 1, 0)])
    return Section(
        title="Orchestration overhead (Prefect + Parquet store + MLflow vs a plain loop)",
        command=".venv/bin/python -m benchmarks.bench_orchestration"
        + (" --quick" if quick else "")
        + ("".join(f" --preset {p} --repeats {r} --warmup {w}" for p, r, w in plan) if custom else ""),
        rows=rows,
        targets=targets,
        notes=notes,
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny preset only, one iteration per way, no warm-up")
    ap.add_argument("--preset", help="time this preset only (default: tiny, then mathchat-smol)")
    ap.add_argument("--repeats", type=int, default=2, help="with --preset: timed iterations per way")
    ap.add_argument("--warmup", type=int, default=0, help="with --preset: untimed iterations per way first")
    a = ap.parse_args()
    print(run(a.quick, [(a.preset, a.repeats, a.warmup)] if a.preset else None).markdown())
