"""The `llm` coach, measured: its scores on a stored run's actions against the rubric and the outcome,
with and without the answer in its input.

    .venv/bin/python benchmarks/coach_agreement.py --run runs/RUN --actions 510     # serves SmolLM2-135M locally
    .venv/bin/python benchmarks/coach_agreement.py --run runs/RUN --base-url http://HOST:8000/v1 --model NAME

It draws a seeded sample of the run's training episodes (every action of each, so the agents are
equally represented), scores every action with the LLM coach twice (`coach.ground_truth` true: the
answer is in its feedback; false: it is not), and with the pipeline's answer-aware and answer-blind
rubrics, through the same code the `coach_evaluate` stage runs. Without `--base-url` it starts
`transformers serve` on the SmolLM2-135M-Instruct the project ships (infra/local_llm.py).

Reported per mode, overall and per agent: the scores the LLM gave (a small coach repeats one), the share
of replies that open like the worked example's rationale (a small coach copies it), Spearman's
rank correlation of the LLM's scores with the answer-aware rubric's and with the episode outcome (over
the actions the LLM scored), the share of actions left unscored (malformed replies, timeouts, errors)
and seconds per action. Rows go to
benchmarks/coach_agreement/<run>-<model>.csv (one per action and mode) every few episodes, and a rerun
of the same command scores only what the file lacks (`--fresh` starts over); --write puts the table in
benchmarks/README.md, and `--report` makes the table from the rows so far without scoring more.

The sampled episodes are first copied, with the run's config.yaml, into a run folder of their own under
benchmarks/coach_agreement/sample/ (a few hundred kB, committed), and scored from there: a measurement
that takes longer than a machine is kept goes on later from that folder alone,

    .venv/bin/python benchmarks/coach_agreement.py --run benchmarks/coach_agreement/sample/RUN --actions 510
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_section  # noqa: E402
from pipelines.base import Episode  # noqa: E402

OUT = ROOT / "benchmarks" / "coach_agreement"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## The LLM coach against the rubric (`benchmarks/coach_agreement.py`)"


def sample_episodes(run_dirs: list[str], n_actions: int, seed: int) -> list[tuple[str, Episode]]:
    """(run, episode) pairs: training episodes of the runs (rollouts and resamples, no infrastructure
    fault), enough of them for `n_actions` actions, drawn with `seed`; all of them when there are fewer."""
    from infra import store
    from tasks.coach_evaluate import load_partition_episodes

    pool = []
    for run_dir in run_dirs:
        eps = store.read_table(run_dir, "episodes")
        parts = eps[(eps["phase"] == "rollout") | eps["phase"].str.startswith("resample")][["iteration", "phase"]]
        pool += [
            (run_dir, e)
            for it, ph in sorted(set(map(tuple, parts.to_numpy())))
            for e in load_partition_episodes(run_dir, int(it), str(ph))
            if not e.infra_error
        ]
    if not pool:
        raise SystemExit(f"{', '.join(run_dirs)}: no training episodes to score")
    per = max(1, len(pool[0][1].actions))
    if len(pool) * per < n_actions:
        print(f"note: the runs hold {len(pool) * per} actions, fewer than the {n_actions} asked for", flush=True)
    rng = np.random.default_rng(seed)
    take = rng.choice(len(pool), size=min(len(pool), math.ceil(n_actions / per)), replace=False)
    return [pool[i] for i in sorted(take)]


def freeze(episodes: list[tuple[str, Episode]], dest: Path) -> list[tuple[str, Episode]]:
    """Copy the sampled episodes (their `episodes` and `actions` rows) and each run's config.yaml into
    `dest`/<run name>, a run folder holding only them; the same episodes, read back from there. A run that
    is already a folder under `dest` is left as it is."""
    import shutil

    from infra import store
    from tasks.coach_evaluate import load_partition_episodes

    out: list[tuple[str, Episode]] = []
    for run_dir in dict.fromkeys(r for r, _ in episodes):
        parts: dict[tuple[int, str], set[str]] = {}  # (iteration, phase) -> its sampled episode ids
        for e in (e for r, e in episodes if r == run_dir):
            parts.setdefault((int(e.actions[0]["iteration"]), str(e.actions[0]["phase"])), set()).add(e.episode_id)
        parts = dict(sorted(parts.items()))
        target = dest / Path(run_dir).name
        if Path(run_dir).resolve() != target.resolve():
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            shutil.copy(Path(run_dir) / "config.yaml", target / "config.yaml")
            for (it, ph), ids in parts.items():
                for table in ("episodes", "actions"):
                    rows = store.read_table(run_dir, table, it, ph)
                    rows = rows[rows["episode_id"].isin(ids)]
                    store.write_partition(target, table, it, ph, rows.to_dict("records"), name="sample")
        for (it, ph), ids in parts.items():
            out += [(str(target), e) for e in load_partition_episodes(str(target), it, ph) if e.episode_id in ids]
    return out


def _key(mode: str, run_dir: str, e: Episode) -> tuple[str, str, int, str]:
    return mode, Path(run_dir).name, int(e.actions[0]["iteration"]), e.episode_id  # ids repeat across iterations


def score(
    episodes: list[tuple[str, Episode]], base_url: str, model: str, csv: Path, chunk: int = 4, concurrency: int = 8
) -> pd.DataFrame:
    """One row per action and mode: the LLM's score, status and latency, the rubrics' scores, the outcome.
    Each `chunk` of episodes is scored in both modes before the next, and its rows appended to `csv`, so a
    measurement stopped early holds both modes on the same episodes; episodes already there are not scored
    again, so it goes on where it stopped."""
    from tasks.coach import CoachConfig
    from tasks.coach_evaluate import score_clean
    from tasks.context import RunContext

    done = set()
    if csv.exists():
        old = pd.read_csv(csv)
        done = set(zip(old["mode"], old["run"], old["iteration"].astype(int), old["episode_id"]))
    for run_dir in dict.fromkeys(r for r, _ in episodes):
        ctx = RunContext(run_dir)
        pipe, base = ctx.pipeline, ctx.config.coach.model_dump()
        mine = [e for r, e in episodes if r == run_dir]
        for k in range(0, len(mine), chunk):
            for truth in (True, False):
                mode = "with answer" if truth else "without answer"
                part = [e for e in mine[k : k + chunk] if _key(mode, run_dir, e) not in done]
                if not part:
                    continue
                cfg = CoachConfig(
                    **base
                    | {"backend": "llm", "base_url": base_url, "model": model, "ground_truth": truth, "cache": False}
                    | {"concurrency": concurrency}
                )
                t0 = time.perf_counter()
                results = score_clean(ctx, cfg, part)
                per_action = (time.perf_counter() - t0) / max(1, sum(map(len, results)))
                rows = []
                for e, rs in zip(part, results):
                    aware, blind = pipe.rubric(e, True), pipe.rubric(e, False)
                    for a, r, (aware_score, _), (blind_score, _) in zip(e.actions, rs, aware, blind):
                        rows.append(
                            {
                                "mode": mode,
                                "run": Path(run_dir).name,
                                "episode_id": e.episode_id,
                                "iteration": int(a["iteration"]),
                                "agent": a["agent"],
                                "llm": r.score,
                                "status": r.status,
                                "latency_s": r.latency_s,
                                "wall_per_action_s": per_action,
                                "rubric": aware_score,
                                "blind_rubric": blind_score,
                                "outcome": e.outcome,
                                "rationale": r.rationale[:200],
                            }
                        )
                pd.DataFrame(rows).to_csv(csv, mode="a", header=not csv.exists(), index=False)
                print(
                    f"{Path(run_dir).name}: episodes {k + 1}-{k + len(mine[k : k + chunk])} of {len(mine)} "
                    f"scored {mode}, {per_action:.1f} s per action",
                    flush=True,
                )
    return scored(episodes, csv)


def scored(episodes: list[tuple[str, Episode]], csv: Path) -> pd.DataFrame:
    """The rows of `csv` for `episodes` that were scored in both modes, so the modes compare on the same actions."""
    if not csv.exists():
        raise SystemExit(f"{csv}: no scores yet (run without --report first)")
    df = pd.read_csv(csv)
    wanted = {_key(m, r, e) for m in ("with answer", "without answer") for r, e in episodes}
    keys = zip(df["mode"], df["run"], df["iteration"].astype(int), df["episode_id"])
    df = df[[k in wanted for k in keys]]
    return df[df.groupby(["run", "iteration", "episode_id"])["mode"].transform("nunique") == 2]


def spearman(x: pd.Series, y: pd.Series) -> tuple[float, int]:
    """(rho, pairs) over the pairs where both are scored; nan for fewer than 3 pairs or a constant side."""
    from scipy.stats import spearmanr

    ok = x.notna() & y.notna()
    if ok.sum() < 3 or x[ok].nunique() < 2 or y[ok].nunique() < 2:
        return math.nan, int(ok.sum())
    return float(spearmanr(x[ok].astype(float), y[ok].astype(float)).statistic), int(ok.sum())


def verdicts(scores: pd.Series) -> str:
    """The scores the LLM gave and how often, e.g. `2×40, 3×9`: a small coach tends to repeat one score
    (often its worked example's), which a correlation over few pairs hides."""
    counts = scores.dropna().astype(float).value_counts().sort_index()
    return ", ".join(f"{s:g}×{n}" for s, n in counts.items()) or "none"


def rho(r: float) -> str:
    return "n/a" if math.isnan(r) else f"{r:.2f}"  # n/a: under 3 pairs, or one side gave a single value


def echoes(df: pd.DataFrame) -> pd.Series:
    """Whether each reply repeats the opening of its mode's worked example's rationale (tasks/coach.py
    EXAMPLES): a coach copying its example instead of judging the action."""
    from tasks.coach import EXAMPLES

    mode = {True: "with answer", False: "without answer"}
    opening = {mode[truth]: reply.split("\n")[0][:30] for truth, (_, reply) in EXAMPLES.items()}
    return pd.Series([opening[m] in str(r) for m, r in zip(df["mode"], df["rationale"])], index=df.index)


def table(df: pd.DataFrame) -> list[str]:
    df = df.assign(echo=echoes(df))
    lines = [
        "| mode | agent | actions | unscored by the LLM | scores given | replies echoing the worked example | "
        "Spearman with answer-aware rubric (pairs) | Spearman with outcome (pairs) | seconds per action |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, g in df.groupby("mode", sort=False):
        for agent, h in [("all", g), *g.groupby("agent", sort=False)]:
            r_rub, n_rub = spearman(h["llm"], h["rubric"])
            r_out, n_out = spearman(h["llm"], h["outcome"])
            lines.append(
                f"| {mode} | {agent} | {len(h)} | {(h['status'] != 'ok').mean():.0%} | {verdicts(h['llm'])} | "
                f"{h['echo'].mean():.0%} | "
                f"{rho(r_rub)} ({n_rub}) | {rho(r_out)} ({n_out}) | {h['wall_per_action_s'].mean():.2f} |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, nargs="+", help="run folders with training partitions (pooled)")
    ap.add_argument("--actions", type=int, default=510, help="actions to score (rounded up to whole episodes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible /v1 URL (default: serve SmolLM2-135M here)")
    ap.add_argument("--model", default=None, help="the model name the server knows (default: the served folder)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight at once (coach default: 4)")
    ap.add_argument("--chunk", type=int, default=8, help="episodes scored in both modes before the CSV is appended")
    ap.add_argument("--report", action="store_true", help="the table from the CSV as it is, scoring nothing more")
    ap.add_argument("--write", action="store_true", help="put the table into benchmarks/README.md")
    ap.add_argument("--fresh", action="store_true", help="score every action again (default: go on from the CSV)")
    ap.add_argument("--note", default="", help="added to the table's heading, e.g. what shared the CPUs and when")
    args = ap.parse_args()
    run_dirs = [str(Path(r).resolve()) for r in args.run]
    episodes = freeze(sample_episodes(run_dirs, args.actions, args.seed), OUT / "sample")
    if args.base_url:
        model = args.model or "coach"
    else:
        from infra.models import smollm2_dir

        model = str(smollm2_dir())
    OUT.mkdir(exist_ok=True)
    runs = "+".join(Path(r).name for r in run_dirs)
    csv = OUT / f"{runs}-{re.sub(r'[^0-9A-Za-z.-]+', '_', Path(model).name)}.csv"
    if args.fresh:
        csv.unlink(missing_ok=True)
    if args.report:
        df = scored(episodes, csv)
    elif args.base_url:
        df = score(episodes, args.base_url, model, csv, args.chunk, args.concurrency)
    else:
        from infra.local_llm import transformers_serve

        with transformers_serve(model) as url:
            df = score(episodes, url, model, csv, args.chunk, args.concurrency)
    command = " ".join(
        [".venv/bin/python benchmarks/coach_agreement.py --run", *args.run, f"--actions {args.actions}"]
        + ([f"--seed {args.seed}"] if args.seed else [])
        + ([f"--base-url {args.base_url} --model {model}"] if args.base_url else [])
    )
    n_episodes = df.groupby(["run", "iteration", "episode_id"]).ngroups
    text = (
        "\n".join(
            [
                SECTION,
                "",
                (
                    f"Command: `{command}` (resumable; `--report --write` makes this table from the rows so far); "
                    f"coach `{Path(model).name}`, {len(df) // 2} actions of {n_episodes} of the {len(episodes)} "
                    f"sampled episodes of `{runs}`, each scored in both modes; {platform.machine()}, "
                    f"{os.cpu_count()} cores. Rows: `{csv.relative_to(ROOT)}`. "
                    "Spearman n/a: under 3 pairs, or one side gave a single value."
                    + (f" {args.note}" if args.note else "")
                ),
                "",
                *table(df),
            ]
        )
        + "\n"
    )
    print(text)
    if args.write:
        write_section(README, SECTION, text)


if __name__ == "__main__":
    main()
