"""The README sections of benchmarks/strategies.py (`--report`, `--write`), made from the CSVs its runs
recorded under benchmarks/strategies/ alone: the TeamTR table with its certificates, and the coaches'
held-out and paraphrased success with their paired differences and the agents' behaviour. It reads no run
folder, so it lives apart from the runner that trains and writes those CSVs.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.certificate_check import summary
from benchmarks.coach_evidence import paired, seed_bootstrap
from benchmarks.common import write_section
from benchmarks.seeds import load_tables
from benchmarks.strategies_variants import ABLATION_PAIRS, COACHES, OUT, OWN_ADVANTAGE_CERTIFICATES, TEAMTR_TABLE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
SECTION = "## TeamTR ablations over seeds (`benchmarks/strategies.py`)"
COACH_SECTION = "## Coaching with and without the answer, over seeds (`benchmarks/strategies.py`)"


def print_report(write: bool) -> None:
    """Print both sections; with `write`, replace each in benchmarks/README.md once it has runs."""
    for section, text, ran in (
        (SECTION, report(), set(load()) & set(TEAMTR_TABLE)),
        (COACH_SECTION, coach_report(), set(load(".questions")) & {"joint", *COACHES}),
    ):
        print(text)
        if write and ran:
            write_section(README, section, text)


def load(kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    return load_tables(OUT, kind)


def team_certified(variant: str, seeds: dict[int, pd.DataFrame]) -> dict[int, pd.DataFrame]:
    """The runs of `variant` whose certificates use the team's advantage (not OWN_ADVANTAGE_CERTIFICATES)."""
    return {s: d for s, d in seeds.items() if (variant, s) not in OWN_ADVANTAGE_CERTIFICATES}


def seeds_named(seeds) -> str:
    """'seed 0' or 'seeds 0, 1'."""
    seeds = sorted(seeds)
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def mean_sd(x: list[float], digits: int = 2) -> str:
    # mean ± sample sd over seeds (sd needs two seeds)
    if len(x) > 1:
        return f"{np.mean(x):.{digits}f} ± {np.std(x, ddof=1):.{digits}f}"
    return f"{x[0]:.{digits}f} (one seed)"


def report() -> str:
    from tasks.evaluation import regressions

    runs = load()
    lines = [
        SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/strategies.py --variants VARIANT --seeds SEEDS` "
        "(defaults: mathchat-smol, 4 iterations, held-out evaluation every 2, kl_delta 0.05), then "
        "`--report --write`. Per-run figures: `benchmarks/strategies/<variant>-s<seed>.csv`.",
        "",
        "| variant | seeds | held-out success by iteration (mean ± sd over seeds) | final held-out per seed | "
        "held-out regressions | extra episodes vs rollouts | updates certified (certificate > 0) |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in TEAMTR_TABLE:
        if variant not in runs:
            continue
        seeds = sorted(runs[variant])
        dfs = [runs[variant][s] for s in seeds]
        evals = [d.dropna(subset=["heldout_success"]) for d in dfs]
        its = sorted(set.intersection(*(set(e["iteration"]) for e in evals)))
        curve = ", ".join(
            f"{it}: {mean_sd([float(e.set_index('iteration').loc[it, 'heldout_success']) for e in evals])}"
            for it in its
        )
        final = ", ".join(f"s{s}: {e['heldout_success'].iloc[-1]:.2f}" for s, e in zip(seeds, evals))
        regress = sum(regressions(e["heldout_success"]) for e in evals)
        extra = [d["train_episodes"].sum() / d["rollout_episodes"].sum() - 1 for d in dfs]
        team = team_certified(variant, runs[variant])
        certs = sum(int(d.loc[d["iteration"] > 0, "certificates"].sum()) for d in team.values())
        certified = sum(int(d.loc[d["iteration"] > 0, "certified_updates"].sum()) for d in team.values())
        cell = f"{certified} of {certs} ({seeds_named(team)})" if certs else "none computed"
        lines.append(
            f"| {variant} | {', '.join(map(str, seeds))} | {curve} | {final} | {regress} | "
            f"{100 * np.mean(extra):.0f}% | {cell} |"
        )
    held, para = per_question(list(TEAMTR_TABLE))
    lines += paired_table(held, para, [(v, "joint") for v in TEAMTR_TABLE if v != "joint"] + ABLATION_PAIRS)
    lines += certificate_table(runs)
    lines += certificate_check_table()
    old = ", ".join(f"{v} seed {s}" for v, s in sorted(OWN_ADVANTAGE_CERTIFICATES) if s in runs.get(v, {}))
    if old:
        lines += [
            "",
            f"Left out of every certificate figure: {old}, whose certificates were computed from each agent's "
            "own advantage with a span of 1, before the team's advantage (`OWN_ADVANTAGE_CERTIFICATES` in "
            "benchmarks/strategies_variants.py); its success figures are in the tables above.",
        ]
    return "\n".join(lines) + "\n"


def certificate_check_table() -> list[str]:
    """Per certified variant, all seeds pooled: the certificates against the improvement measured on the
    next fresh batch (benchmarks/certificate_check.py)."""
    checks = {v: team_certified(v, runs) for v, runs in load(".certcheck").items() if v in TEAMTR_TABLE}
    checks = {v: runs for v, runs in checks.items() if runs}
    if not checks:
        return []
    lines = [
        "",
        "The certificates against the improvement the next fresh batch measures (benchmarks/"
        "certificate_check.py; the seeds named pooled; a valid bound has dJ_hat - certificate >= 0 in the mean, and "
        "dJ_hat - gain below 0 is the gain's in-sample optimism):",
    ]
    for variant, runs in checks.items():
        lines += [
            "",
            f"**{variant}** ({seeds_named(runs)})",
            "",
            *summary(pd.concat(runs.values())),
        ]
    return lines


def certificate_table(runs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Per certified variant and iteration: the stage certificate (mean ± sd over seeds), the updates it
    certified, and the held-out change over the evaluation interval that iteration ends."""
    lines = [
        "",
        "Certificates per iteration (tasks/certificate.py; a stage's certificate is the sum of its "
        "updates'), beside the held-out change measured over the evaluation interval ending there:",
        "",
        "| variant | iteration | stage gain | stage penalty | stage certificate | updates certified | "
        "held-out change |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in TEAMTR_TABLE:
        dfs = team_certified(variant, runs.get(variant, {}))
        if not dfs or not any(d["certificates"].sum() for d in dfs.values()):
            continue
        for it in sorted(set.intersection(*(set(d["iteration"]) for d in dfs.values())) - {0}):
            rows = [d.set_index("iteration").loc[it] for d in dfs.values()]
            change = []
            for d in dfs.values():
                ev = d.dropna(subset=["heldout_success"]).set_index("iteration")["heldout_success"]
                if it in ev.index and len(ev.loc[:it]) > 1:
                    change.append(float(ev.loc[it] - ev.loc[:it].iloc[-2]))
            lines.append(
                f"| {variant} | {it} | {mean_sd([r['stage_gain'] for r in rows], 4)} | "
                f"{mean_sd([r['stage_penalty'] for r in rows], 4)} | "
                f"{mean_sd([r['stage_certificate'] for r in rows], 4)} | "
                f"{sum(int(r['certified_updates']) for r in rows)} of {sum(int(r['certificates']) for r in rows)} | "
                f"{mean_sd(change) if change else '-'} |"
            )
    return lines


def coach_report() -> str:
    """Issue 21: held-out success of the three coaches before and after training over seeds, on the generated
    split and the paraphrased set; their paired differences; the agents' behaviour before and after."""
    coaches = ["joint", *COACHES]
    held, para = per_question(coaches)
    base = OUT / "base.paraphrased.csv"
    base = pd.read_csv(base).set_index("task_id")["success"] if base.exists() else None
    lines = [
        COACH_SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/strategies.py --variants joint blind outcome "
        "--seeds 0 1 2` (mathchat-smol, 4 iterations, held-out evaluation every 2), `--backfill RUNS_DIR` for "
        "runs that ended without the per-question files, then `--report --write`. joint: the rubric coach with "
        "the answer; blind: the answer-blind rubric (`coach.ground_truth=false`); outcome: the episode's outcome "
        "as every action's score (`coach.backend=outcome`); llm: SmolLM2-135M-Instruct as the judge, with the "
        "answer (`coach.backend=llm`, served by `transformers serve`; `--variants llm --iterations 2`); all at "
        "the same rollouts. Held-out: each training "
        "seed's generated split, played greedily; paraphrased: benchmarks/data/mathchat-paraphrased.jsonl, 100 "
        "problems of the trained kinds phrased unlike the training templates, with names, items and number "
        "ranges training never shows (pipelines/mathchat/paraphrased.py). Mean ± sd over seeds; a gain or a "
        "difference is the mean over seeds of the per-seed mean paired difference over questions, with a 95% "
        "bootstrap interval resampling seeds and, within each, questions. Per-run files: "
        "`benchmarks/strategies/<variant>-s<seed>.{questions,paraphrased,agents}.csv` and "
        "`base.paraphrased.csv` (benchmarks/coach_evidence.py).",
        "",
    ]
    if not held:
        return "\n".join(lines + ["No runs yet."]) + "\n"
    lines += [
        "| coach | seeds | final iteration | held-out before | held-out after | held-out gain | "
        "paraphrased untrained | paraphrased after | paraphrased gain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in (v for v in coaches if v in held):
        seeds = sorted(held[v])
        before, after = [held[v][s][0] for s in seeds], [held[v][s][max(held[v][s])] for s in seeds]
        unseen = [para[v][s] for s in sorted(para.get(v, {}))]
        cells = [
            v,
            ", ".join(map(str, seeds)),
            ", ".join(sorted({str(max(held[v][s])) for s in seeds})),
            spread([x.mean() for x in before]),
            spread([x.mean() for x in after]),
            ci([paired(a, b) for a, b in zip(after, before)]),
            "-" if base is None else f"{base.mean():.2f}",
            spread([x.mean() for x in unseen]),
            "-" if base is None else ci([paired(x, base) for x in unseen]),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    lines += paired_table(held, para, list(combinations([v for v in coaches if v in held], 2)))
    return "\n".join(lines + agents_table([v for v in coaches if v in held])) + "\n"


def per_question(variants: list[str]) -> tuple[dict, dict]:
    """variant -> seed -> iteration -> held-out success by task; variant -> seed -> paraphrased success by task."""
    questions = load(".questions")
    held = {v: {s: by_iteration(df) for s, df in runs.items()} for v, runs in questions.items() if v in variants}
    para = {
        v: {s: df.set_index("task_id")["success"] for s, df in runs.items()}
        for v, runs in load(".paraphrased").items()
        if v in variants
    }
    return held, para


def paired_table(held: dict, para: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """Lines of the paired differences A − B over the seeds both have, held-out and paraphrased."""
    lines = [
        "",
        "Paired differences A − B (the same training seed and question, at the last iteration both runs "
        "evaluated; both start from the same untrained team, so on the paraphrased set a difference in gain "
        "is the difference after; that set is played by each run's final team, so it pairs only runs that "
        "ended at the same iteration):",
        "",
        "| A − B | seeds | iteration | held-out after | held-out gain | paraphrased after |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in pairs:
        seeds = sorted(set(held.get(a, {})) & set(held.get(b, {})))
        if not seeds:
            continue
        at = {s: max(set(held[a][s]) & set(held[b][s])) for s in seeds}
        after = [paired(held[a][s][at[s]], held[b][s][at[s]]) for s in seeds]
        gain = [paired(held[a][s][at[s]] - held[a][s][0], held[b][s][at[s]] - held[b][s][0]) for s in seeds]
        ended_alike = [s for s in seeds if max(held[a][s]) == max(held[b][s]) == at[s]]
        both = sorted(set(para.get(a, {})) & set(para.get(b, {})) & set(ended_alike))
        lines.append(
            f"| {a} − {b} | {', '.join(map(str, seeds))} | {', '.join(sorted({str(i) for i in at.values()}))} | "
            f"{ci(after)} | {ci(gain)} | {ci([paired(para[a][s], para[b][s]) for s in both])} |"
        )
    return lines


def by_iteration(df: pd.DataFrame) -> dict[int, pd.Series]:
    """A questions table's success per question (task_id) at each evaluated iteration."""
    return {int(it): g.set_index("task_id")["success"] for it, g in df.groupby("iteration")}


def agents_table(coaches: list[str]) -> list[str]:
    """Each behaviour rate on the held-out split before (iteration 0) and after (the last evaluation) per coach."""
    runs = load(".agents")
    ev = {v: [d[d["phase"] == "eval"] for d in runs.get(v, {}).values()] for v in coaches}
    keys = list(dict.fromkeys((a, r) for ds in ev.values() for d in ds for a, r in zip(d["agent"], d["rate"])))
    lines = [
        "",
        "Agents' behaviour on the held-out split (greedy), before -> after training, mean ± sd over seeds "
        "(benchmarks/coach_evidence.py): plan_quantities, the share of the question's numbers the solver's plan "
        "mentions; plan_is_code, plans written as code; code_error, programs that gave no number; answer_stated, "
        "verifier replies that state an integer; answer_format, those as `ANSWER: <int>`; faithful, of the "
        "episodes whose program printed a number, those whose stated answer is that number.",
        "",
        f"| agent | rate | {' | '.join(coaches)} |",
        "|---|---|" + "---|" * len(coaches),
    ]

    def value(d: pd.DataFrame, agent: str, rate: str, iteration: int) -> float:
        rows = d[(d["agent"] == agent) & (d["rate"] == rate) & (d["iteration"] == iteration)]
        return float(rows["value"].iloc[0]) if len(rows) else np.nan

    for agent, rate in keys:
        cells = [
            f"{spread([value(d, agent, rate, 0) for d in ev[v]])} -> "
            f"{spread([value(d, agent, rate, d['iteration'].max()) for d in ev[v]])}"
            if ev[v]
            else "-"
            for v in coaches
        ]
        lines.append(f"| {agent} | {rate} | {' | '.join(cells)} |")
    return lines if keys else []


def spread(x: list[float]) -> str:
    """mean_sd of the values that exist ("-": none)."""
    x = [v for v in x if not np.isnan(v)]
    return mean_sd(x) if x else "-"


def ci(diffs: list[np.ndarray]) -> str:
    """The seed bootstrap's estimate and 95% interval of per-seed paired differences ("-": no pairs)."""
    diffs = [d for d in diffs if d.size]
    if not diffs:
        return "-"
    m, lo, hi = seed_bootstrap(diffs)
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"
