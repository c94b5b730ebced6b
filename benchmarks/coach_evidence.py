"""Issue 21's figures of one training run, written by benchmarks/strategies.py when the run ends (or by its
`--backfill`), and the statistics its report draws from them over seeds.

Files, beside strategies.py's per-iteration `<variant>-s<seed>.csv`:

- `<variant>-s<seed>.questions.csv` (iteration, task_id, question, success): the greedy success (1/0) of
  every held-out question at every evaluated iteration (phase `eval`); empty where an infrastructure
  fault hit the episode, which the success rate leaves out too (flows/report.py).
- `<variant>-s<seed>.paraphrased.csv` (the same columns): the run's final team on
  benchmarks/data/mathchat-paraphrased.jsonl (`teamrl eval RUN --problems FILE`); `iteration` is the run's.
  `base.paraphrased.csv`, written once: the untrained team (iteration 0; every run starts from the
  same base model and evaluation plays greedily, so one run's iteration 0 stands for all).
- `<variant>-s<seed>.agents.csv` (phase, iteration, agent, rate, value, episodes): behaviour rates per
  training iteration (phase `rollout`, the sampled episodes the update learns from) and per evaluation
  (phase `eval`, greedy), each over the `episodes` where it applies (no infrastructure fault), judged
  by the checks of pipelines/mathchat/rubric.py:
    solver   plan_quantities  mean share of the question's numbers the plan mentions (`quantities_used`)
    solver   plan_is_code     share of plans that are code instead of a plan (the answer-blind rubric's check)
    executor code_error       share of programs that gave no number: no code block, timeout, error, or
                              nothing printed (`executor_failure`)
    verifier answer_stated    share of replies that state an integer (`extract_int`)
    verifier answer_format    share of replies that state it as `ANSWER: <int>` or `\\boxed{}` (`ANSWER_RE`)
    verifier faithful         over the episodes whose program printed a number: share whose stated
                              answer is that number
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.mathchat.paraphrased import FILE as PARAPHRASED

ROOT = Path(__file__).resolve().parents[1]


def teamrl(*args: str) -> int:
    """Run `teamrl ARGS` with this checkout's code (whatever else is installed), offline; its exit status.
    The command ends with this process however it ends (`kill` of the driver included), so that no run
    goes on holding its run's lock; `--resume` finishes it."""
    cmd = [sys.executable, "-m", "flows.cli", *args]
    print(" ".join(cmd), flush=True)
    launcher = [sys.executable, "-I", str(ROOT / "infra" / "die_with_parent.py"), str(os.getpid())]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"}
    return subprocess.run([*launcher, *cmd], cwd=ROOT, env=env).returncode


def question_success(run_dir: Path) -> pd.DataFrame:
    """One row per greedy held-out episode: iteration, task_id, question, success (NaN: infrastructure fault)."""
    from infra import store

    eps = store.read_table(run_dir, "episodes")
    eps = eps[(eps["phase"] == "eval") & (eps["metrics"].map(lambda m: dict(m).get("greedy", 0.0)) == 1.0)]
    success = np.where(eps["infra_error"].isna(), eps["success"].astype(float), np.nan)
    df = pd.DataFrame(
        {
            "iteration": eps["iteration"].astype(int).to_numpy(),
            "task_id": eps["task_id"].to_numpy(),
            "question": eps["question"].to_numpy(),
            "success": success,
        }
    )
    return df.sort_values(["iteration", "task_id"]).reset_index(drop=True)


def behaviour(ep) -> dict[tuple[str, str], float | None]:
    """(agent, rate) -> this episode's value of each rate of the module docstring (None: does not apply)."""
    from pipelines.base import extract_code
    from pipelines.mathchat.rubric import ANSWER_RE, executor_failure, extract_int, program_result, quantities_used

    out, printed = program_result(ep)
    plan, reply = ep.actions[0]["response_text"] or "", ep.actions[2]["response_text"] or ""
    return {
        ("solver", "plan_quantities"): quantities_used(ep),
        ("solver", "plan_is_code"): float(extract_code(plan) is not None),
        ("executor", "code_error"): float(executor_failure(out, printed) is not None),
        ("verifier", "answer_stated"): float(extract_int(reply) is not None),
        ("verifier", "answer_format"): float(ANSWER_RE.search(reply) is not None),
        ("verifier", "faithful"): None if printed is None else float(ep.final_answer == str(printed)),
    }


def agent_rates(run_dir: Path) -> pd.DataFrame:
    """The behaviour rates of every rollout and greedy held-out partition of a MathChat run."""
    from infra import store
    from tasks.coach_evaluate import load_partition_episodes

    eps = store.read_table(run_dir, "episodes")
    parts = eps[eps["phase"].isin(["rollout", "eval"])].groupby(["iteration", "phase"], sort=True).size().index
    rows = []
    for it, phase in parts:
        played = [
            e
            for e in load_partition_episodes(run_dir, int(it), str(phase))
            if not e.infra_error and (phase == "rollout" or e.metrics.get("greedy") == 1.0)
        ]
        values: dict[tuple[str, str], list[float]] = {}
        for e in played:
            for key, v in behaviour(e).items():
                values.setdefault(key, []).extend([] if v is None else [v])
        rows += [
            {
                "phase": phase,
                "iteration": int(it),
                "agent": agent,
                "rate": rate,
                "episodes": len(v),
                "value": float(np.mean(v)) if v else np.nan,
            }
            for (agent, rate), v in values.items()
        ]
    return pd.DataFrame(rows, columns=["phase", "iteration", "agent", "rate", "value", "episodes"])


def problems_folder(run_dir: Path, iteration: int, problems: Path) -> Path:
    """The folder `eval-<run>-...` where the run's team at `iteration` played the file `problems` as it is now
    (`teamrl eval RUN --problems FILE`): one made before is reused (and finished if it stopped midway)."""
    from infra import runs, store

    sha = hashlib.sha256(problems.read_bytes()).hexdigest()

    def made() -> Path | None:
        for f in sorted(run_dir.parent.glob("eval-*")):
            cfg = runs.read_run_config(f) if (f / "config.yaml").exists() else {}
            src, user = cfg.get("source") or {}, cfg.get("problems") or {}
            if (
                src.get("iteration") == iteration
                and Path(src.get("run", "")).resolve() == run_dir.resolve()
                and user.get("sha256", {}).get("file") == sha
            ):
                return f
        return None

    folder, where = made(), str(run_dir.parent)
    if folder is None:
        if teamrl("eval", run_dir.name, "--problems", str(problems), "--iteration", str(iteration), "--dir", where):
            raise SystemExit(f"evaluating {run_dir.name} on {problems.name} failed; rerun this command to retry")
        folder = made()
    elif not store.partition_exists(folder, "episodes", 0, "eval") and teamrl("eval", folder.name, "--dir", where):
        raise SystemExit(f"finishing {folder} failed; rerun this command to retry")
    return folder


def paraphrased(run_dir: Path, iteration: int, problems: Path) -> pd.DataFrame:
    """question_success of the run's team at `iteration` on `problems`, with the run's iteration."""
    return question_success(problems_folder(run_dir, iteration, problems)).assign(iteration=iteration)


def write_figures(run_dir: Path, out: Path, name: str, problems: Path = PARAPHRASED) -> None:
    """Write the figures of the finished run `run_dir` named `<name>.*.csv` (and `base.paraphrased.csv`) that
    `out` lacks; a file that exists is kept. The behaviour checks and the paraphrased set are MathChat's."""
    from flows.evaluate import last_iteration
    from infra import runs

    run_dir = run_dir.resolve()
    figures = {f"{name}.questions.csv": lambda: question_success(run_dir)}
    if runs.read_run_config(run_dir)["pipeline"]["name"] == "mathchat":
        final = last_iteration(run_dir)
        figures |= {
            f"{name}.agents.csv": lambda: agent_rates(run_dir),
            f"{name}.paraphrased.csv": lambda: paraphrased(run_dir, final, problems),
            "base.paraphrased.csv": lambda: paraphrased(run_dir, 0, problems),
        }
    out.mkdir(parents=True, exist_ok=True)
    for file, make in figures.items():
        if not (out / file).exists():
            tmp = out / f".{file}.tmp"  # renamed into place: a file that exists is complete
            make().to_csv(tmp, index=False, float_format="%.6g")
            tmp.replace(out / file)
            print(f"{out / file}: written", flush=True)


# --- statistics over seeds -------------------------------------------------------------------------------------


def paired(a: pd.Series, b: pd.Series) -> np.ndarray:
    """a[q] - b[q] over the problems q (the index: task_id) that have a value in both."""
    return (a - b).dropna().to_numpy(dtype=float)


def seed_bootstrap(
    diffs: list[np.ndarray], n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """The mean over seeds of each seed's mean paired difference over its problems, with a percentile bootstrap
    interval that resamples the seeds and, within each drawn seed, its problems."""
    # estimate: (1/S) sum_s mean_q d[s][q]; a replicate: S seeds s* drawn with replacement, each with n_s* problems
    rng = np.random.default_rng(seed)
    s = len(diffs)
    # within[seed, rep, slot]: the mean of a resample of that seed's problems
    within = np.stack([d[rng.integers(0, d.size, size=(n_boot, s, d.size))].mean(axis=2) for d in diffs])
    reps = within[rng.integers(0, s, size=(n_boot, s)), np.arange(n_boot)[:, None], np.arange(s)].mean(axis=1)
    a = (1 - level) / 2
    return float(np.mean([d.mean() for d in diffs])), float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))
