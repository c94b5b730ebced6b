"""Peak memory of `make demo`: the whole process tree's resident memory, sampled while it trains.

    .venv/bin/python -m benchmarks.bench_memory [--quick] [--iterations N]

Runs `teamrl train mathchat-smol` (the demo's preset; --quick: `tiny`) in a temporary run folder and
samples the summed RSS of the trainer and every process it starts (the Prefect API, sandboxes) every
0.2 s. One iteration by default, without the held-out evaluations: an iteration already holds the
model, the rollouts and an update, the demo's largest moments; `--iterations 6 --evaluate` is the
whole demo.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.common import Section

ROOT = Path(__file__).resolve().parents[1]


def tree_rss(proc: psutil.Process) -> int:
    """Bytes resident in `proc` and all its descendants (processes that end meanwhile count as 0)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def peak_rss(cmd: list[str], env: dict) -> tuple[int, float, int]:
    """(peak bytes of the process tree, wall seconds, exit code) of `cmd`."""
    t0, peak = time.perf_counter(), 0
    child = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    while child.poll() is None:
        peak = max(peak, tree_rss(proc))
        time.sleep(0.2)
    err = child.stderr.read()
    if child.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({child.returncode}):\n{err[-2000:]}")
    return peak, time.perf_counter() - t0, child.returncode


def run(quick: bool = False, iterations: int = 1, evaluate: bool = False) -> Section:
    preset = "tiny" if quick else "mathchat-smol"
    with tempfile.TemporaryDirectory(prefix="teamrl-bench-mem-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "flows.cli",
            "train",
            preset,
            "--set",
            f"run.dir={tmp}",
            "--set",
            f"iterations={iterations}",
            "--set",
            f"evaluate={str(evaluate).lower()}",
        ]
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"}
        peak, wall, _ = peak_rss(cmd, env)
    what = f"{iterations} iteration(s), {'with' if evaluate else 'without'} held-out evaluations"
    return Section(
        title="Peak memory of the demo",
        command=f".venv/bin/python -m benchmarks.bench_memory{' --quick' if quick else ''}",
        rows=[{"run": f"teamrl train {preset}, {what}", "peak RSS GiB (process tree)": peak / 2**30, "wall s": wall}],
        notes=["RSS sampled every 0.2 s over the trainer and its child processes; shared pages count once per process"],
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny preset")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--evaluate", action="store_true", help="with the held-out evaluations (the whole demo: 6)")
    a = ap.parse_args()
    print(run(a.quick, a.iterations, a.evaluate).markdown())
