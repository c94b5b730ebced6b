"""Prefect API calls made for the stages' progress artifacts, and their seconds, per `train` iteration of the
`tiny` preset (iterations 2-6 through `flows.train.train_iteration`, against a temporary Prefect server).

    .venv/bin/python benchmarks/progress_calls.py

Run it with PYTHONPATH=<checkout> to count another commit's calls (bench_orchestration.py times the same
calls inside its iterations, from this commit on).
"""

import statistics
import tempfile
import time
from pathlib import Path

import prefect.artifacts
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from flows.config import load_config
from flows.train import train_iteration
from infra import runs
from infra.tracking import Tracker
from tasks.context import RunContext

spent: list[float] = []
for name in ("create_progress_artifact", "update_progress_artifact"):  # infra/progress.py imports them per call

    def timed(*args, _fn=getattr(prefect.artifacts, name), **kwargs):
        t0 = time.perf_counter()
        try:
            return _fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    setattr(prefect.artifacts, name, timed)


@flow(name="progress-calls")
def iterations(rd: str, n: int = 6) -> list[tuple[int, float]]:
    with RunContext(rd) as run:
        cfg, agents = run.config, [a.name for a in run.pipeline.agents]
        tracker = Tracker(rd, cfg.run.dir, cfg.run.experiment, cfg.run.tracking_uri, cfg.model_dump(mode="json"))
        per = []
        for k in range(1, n + 1):
            spent.clear()
            train_iteration(run, k, agents, cfg, tracker)
            per.append((len(spent), sum(spent)))
        tracker.finish()
    return per[1:]  # the first pays for the server's warm-up


root = Path(tempfile.mkdtemp(prefix="progress-calls-"))
cfg = load_config("tiny", [f"run.dir={root}", "run.id=r", "evaluate=false", "iterations=100"])
rd = str(runs.create_run(root, "r", cfg.model_dump(mode="json")))
with RunContext(rd) as first:
    for a in (a.name for a in first.pipeline.agents):
        first.policy.load(rd, a, 0)
        first.policy.save(rd, a, 0)
with prefect_test_harness(server_startup_timeout=120):
    per = iterations(rd)
print(
    f"progress-artifact calls per iteration: {statistics.median(c for c, _ in per):g}, "
    f"{statistics.median(s for _, s in per) * 1000:.1f} ms (median of {len(per)} iterations)"
)
