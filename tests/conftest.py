import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TEAMRL_PROGRESS", "0")

# Kernels held to AVX2, with MKL in its strict reproducible mode, for this process and every process it starts:
# unpinned, two processes on one machine have rounded a GEMM's last bit differently, and a later update amplifies
# that past any float tolerance, so a fixture's run here and its killed-and-resumed twin in a child would differ.
# numpy and its OpenBLAS dispatch by CPU too (numpy's AVX-512 log and exp round differently from its AVX2 ones).
ISA_PIN = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
}


def _has_avx2() -> bool:
    try:
        return " avx2" in open("/proc/cpuinfo").read()
    except OSError:
        return False


if _has_avx2():  # set before torch loads; forcing AVX2 kernels on a CPU without AVX2 would crash
    for _key, _value in ISA_PIN.items():
        os.environ.setdefault(_key, _value)

import pytest  # noqa: E402

import infra.telemetry  # noqa: E402,F401  (usage reporting off, as in every process teamrl starts)


def pytest_addoption(parser):
    parser.addoption(
        "--durations-json",
        metavar="PATH",
        help="write each test's seconds (setup + call + teardown) and the session's total to PATH as JSON "
        "(tests/durations.json is the committed record: docs/operations/tests.md)",
    )


_SECONDS: dict[str, float] = {}  # each test's wall seconds (setup + call + teardown)
_CPU: dict[str, tuple[float, float]] = {}  # its CPU seconds: in this process, in the processes it started
_STARTED = time.monotonic()


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process, and of its ended children (their own ended children included)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's CPU seconds here and in the processes it started: what its wall time is not (waits)."""
    before = _cpu()
    yield
    after = _cpu()
    _CPU[item.nodeid] = (after[0] - before[0], after[1] - before[1])


def pytest_runtest_logreport(report):
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    import json
    import platform

    path = session.config.getoption("--durations-json")
    if not path or not _SECONDS:
        return
    record = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_1min_at_end": round(os.getloadavg()[0], 2),
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "exit_status": int(session.exitstatus),  # 2: interrupted, so a partial record
        "tests": len(_SECONDS),
        "wall_seconds": round(time.monotonic() - _STARTED, 1),
        "seconds_in_tests": round(sum(_SECONDS.values()), 1),
        "cpu_seconds_in_tests": [round(sum(c[i] for c in _CPU.values()), 1) for i in (0, 1)],
        # each test's seconds, slowest first, and its CPU seconds in this process and in the ones it started
        "slowest": {
            k: [round(v, 1), *(round(c, 1) for c in _CPU.get(k, (0.0, 0.0)))]
            for k, v in sorted(_SECONDS.items(), key=lambda kv: -kv[1])
        },
    }
    with open(path, "w") as fh:
        json.dump(record, fh, indent=1)
        fh.write("\n")


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server (SQLite) for the whole session."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        # for the CLI commands tests start in their own processes (harness_api_env), not for this process
        os.environ[TEST_SERVER] = str(PREFECT_API_URL.value())
        try:
            yield
        finally:
            os.environ.pop(TEST_SERVER, None)


TEST_SERVER = "TEAMRL_TEST_PREFECT_API_URL"


def harness_api_env() -> dict[str, str]:
    """PREFECT_API_URL of the session's Prefect test server while prefect_harness runs (else nothing): a CLI
    command started with it uses that server, as with `prefect server start`, instead of starting a
    temporary one of its own (a user's Prefect profile is never used)."""
    return {"PREFECT_API_URL": os.environ[TEST_SERVER]} if TEST_SERVER in os.environ else {}


def train_items(n=6, old_logprob=-10.0):
    """`n` seeded TrainItems of random prompts and responses (lengths 5+i and 3..5), old log-probs all
    `old_logprob`, random advantages: the trainer tests' batch."""
    import torch

    from infra.trainer import TrainItem

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        p = torch.randint(10, 1000, (5 + i,), generator=g).tolist()
        r = torch.randint(10, 1000, (3 + i % 3,), generator=g).tolist()
        out.append(TrainItem(p, r, [old_logprob] * len(r), torch.randn(len(r), generator=g).tolist(), [1] * len(r)))
    return out


def tiny_config(run_dir, *overrides):
    from flows.config import load_config

    return load_config("tiny", [f"run.dir={run_dir}", *overrides])


@pytest.fixture(scope="session")
def trained_run(prefect_harness, tmp_path_factory):
    """The tiny preset trained for 2 iterations through the real train flow (shared by several tests)."""
    from flows.train import train

    root = tmp_path_factory.mktemp("runs")
    run_dir = train(config=tiny_config(root, "run.id=spine", "seed=1"))
    return root, run_dir


def table_rows(run_dir, table):
    """A table without the columns that legitimately differ between runs (ids, timings), in a fixed row order."""
    from infra import store

    drop = {"run_id", "latency_s", "seconds"}
    df = store.read_table(run_dir, table)
    df = df[[c for c in df.columns if c not in drop]]
    keys = [c for c in store.KEYS if c in df]
    return df.sort_values(keys).reset_index(drop=True)


def table_content(run_dir, table):
    """table_rows as strings: for runs of one process, whose floats are bitwise equal."""
    return table_rows(run_dir, table).astype(str)


# Two processes on one machine can round a float32 kernel's last bit differently (seen in CI: log-probs 1 ulp
# apart in 4 of 96 actions of a killed run and the uninterrupted one, the sampled tokens the same), so runs of
# different processes are compared in floats to well below any update's effect, and in everything else exactly.
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-6


def _float_cells(col):
    """(each row's list length, or None for a scalar or missing cell; the float values as one flat array) for a
    float column or a column of float lists; None for any other column."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_float_dtype(col):
        return [None] * len(col), col.to_numpy(dtype=float)
    arrays = [None if np.ndim(c) == 0 and pd.isna(c) else np.asarray(c) for c in col]
    present = [a for a in arrays if a is not None]
    if not present or any(a.ndim != 1 or a.dtype.kind != "f" for a in present):
        return None
    return [None if a is None else len(a) for a in arrays], np.concatenate(present)


def assert_same_table(ref_dir, run_dir, table) -> None:
    """`table` of run `run_dir` equals the reference run's: float columns to FLOAT_RTOL / FLOAT_ATOL (missing
    cells and list lengths exactly), every other column exactly."""
    import numpy as np
    import pandas as pd

    a, b = table_rows(ref_dir, table), table_rows(run_dir, table)
    assert list(a.columns) == list(b.columns) and len(a) == len(b), f"{table}: other columns or rows"
    for name in a.columns:
        x, y = _float_cells(a[name]), _float_cells(b[name])
        if x is None or y is None:
            pd.testing.assert_series_equal(a[name].astype(str), b[name].astype(str), obj=f"{table}.{name}")
            continue
        assert x[0] == y[0], f"{table}.{name}: list lengths or missing cells differ"
        np.testing.assert_allclose(
            y[1], x[1], rtol=FLOAT_RTOL, atol=FLOAT_ATOL, equal_nan=True, err_msg=f"{table}.{name}"
        )


TEAMTR = ("algorithm.strategy=teamtr", "algorithm.kl_delta=0.05", "algorithm.order=random", "evaluate=false", "seed=1")


def redo_update(run_dir, iteration: int, agent: str, **algorithm) -> dict:
    """Iteration `iteration`'s update of `agent` (from version iteration - 1: every earlier update wrote one)
    in the run folder `run_dir` (a copy: this rewrites it) done again with the `algorithm` settings changed;
    its `updates` row, with the warnings it gave as `warnings`."""
    import shutil
    import warnings

    import yaml

    from infra import store
    from infra.policy import checkpoint_dir
    from tasks.context import RunContext
    from tasks.update import update

    cfg = yaml.safe_load(open(f"{run_dir}/config.yaml"))
    cfg["algorithm"] |= algorithm
    yaml.safe_dump(cfg, open(f"{run_dir}/config.yaml", "w"))
    (store.partition_dir(run_dir, "updates", iteration, "rollout") / f"part-{agent}.parquet").unlink()
    shutil.rmtree(checkpoint_dir(run_dir, agent, iteration), ignore_errors=True)
    with RunContext(run_dir) as run, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        update.fn(run, iteration, "rollout", agent, iteration - 1)
    row = store.read_table(run_dir, "updates", iteration, "rollout", name=agent).iloc[0].to_dict()
    return row | {"warnings": " ".join(str(w.message) for w in caught)}


@pytest.fixture(scope="session")
def teamtr_run(prefect_harness, tmp_path_factory):
    """The tiny preset trained with TeamTR (random order, resamples, trust region) for 2 iterations."""
    from flows.train import train

    root = tmp_path_factory.mktemp("runs")
    return root, train(config=tiny_config(root, "run.id=teamtr", *TEAMTR))


MARS = ("iterations=1", "evaluate=false")


@pytest.fixture(scope="session")
def mars_run(prefect_harness, tmp_path_factory):
    """The deepresearch-tiny preset (System 2 + System 1, GRPO over trajectories) for one iteration."""
    from flows.config import load_config
    from flows.train import train

    root = tmp_path_factory.mktemp("runs")
    return root, train(config=load_config("deepresearch-tiny", [f"run.dir={root}", "run.id=mars", *MARS]))


@pytest.fixture(scope="session")
def dsbench_run(prefect_harness, tmp_path_factory):
    """The dsbench-tiny preset (programs run in the sandbox) for one iteration, evaluated before and after."""
    from flows.config import load_config
    from flows.train import train

    root = tmp_path_factory.mktemp("runs")
    return train(config=load_config("dsbench-tiny", [f"run.dir={root}", "run.id=ds", "iterations=1"]))


@pytest.fixture(scope="module")
def policy():
    """Two agents, `a` and `b`, as LoRA adapters on the tiny model (one per test module)."""
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a", "b"], seed=0)


def run_in_session(cmd: list[str], env: dict[str, str], log, timeout: int = 600) -> tuple[int, str]:
    """`cmd` in its own session from the repository root, output to `log` (a pipe would be held open by a
    Prefect server it left after a SIGKILL); afterwards kill whatever it left behind. (exit status, output)"""
    import signal
    import subprocess
    from pathlib import Path

    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return rc, Path(log).read_text()
