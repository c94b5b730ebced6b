"""The report of `benchmarks/mars.py` (`--report`): its per-run CSVs aggregated over seeds into the tables of
benchmarks/README.md's MARS section, held-out curves, training figures, per-hop success, paired contrasts and
where held-out answers are lost."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks import mars
from benchmarks.coach_evidence import paired, seed_bootstrap
from benchmarks.seeds import load_tables, wall_minutes
from benchmarks.strategies_report import mean_sd


def load(kind: str = "") -> dict[str, dict[int, pd.DataFrame]]:
    return load_tables(mars.OUT, kind)


def before_after(evals: list[pd.DataFrame], first: int, last: int, col: str) -> str:
    """`col` at evaluation `first` -> at `last`, mean ± sd over the seeds' tables (indexed by iteration)."""
    if not all(col in e for e in evals):
        return "-"
    return f"{mean_sd([e.loc[first, col] for e in evals])} -> {mean_sd([e.loc[last, col] for e in evals])}"


def report() -> str:
    runs, qs = load(), load(".questions")
    walls = wall_minutes(mars.OUT)
    lines = [
        mars.SECTION,
        "",
        "Commands: `.venv/bin/python benchmarks/mars.py --variants VARIANT --seeds SEEDS` (defaults: "
        "deepresearch-smol, 6 iterations, held-out evaluation every 2), then `--report --write`. Held-out: "
        "the preset's 50 held-out questions, greedy; mean ± sd over seeds; a gain is the mean over seeds of "
        "the per-seed mean paired difference over questions, with a 95% bootstrap interval resampling seeds "
        "and, within each, questions. Per-run files: `benchmarks/mars/<variant>-s<seed>.csv` and "
        "`.questions.csv`; wall times and what shared the machine: `benchmarks/mars/runs.jsonl`.",
        "",
        "| variant | seeds | held-out EM by iteration | EM gain | F1 before -> after | year EM before -> after | "
        "name EM before -> after | wall per run (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in mars.VARIANTS:
        if variant not in runs:
            continue
        seeds = sorted(runs[variant])
        evals = [runs[variant][s].dropna(subset=["heldout_em"]).set_index("iteration") for s in seeds]
        its = sorted(set.intersection(*(set(e.index) for e in evals)))
        curve = ", ".join(f"{it}: {mean_sd([float(e.loc[it, 'heldout_em']) for e in evals])}" for it in its)
        first, last = its[0], its[-1]

        diffs = []
        for s in seeds:
            q = qs[variant][s].set_index("task_id")
            diffs.append(paired(q[q["iteration"] == last]["em"], q[q["iteration"] == first]["em"]))
        gain, lo, hi = seed_bootstrap(diffs)
        wall = [walls[(variant, s)] for s in seeds if (variant, s) in walls]
        cells = [before_after(evals, first, last, c) for c in ("heldout_f1", "heldout_em_year", "heldout_em_name")]
        lines.append(
            f"| {variant} | {', '.join(map(str, seeds))} | {curve} | {gain:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
            + " | ".join(cells)
            + f" | {mean_sd(wall, 0) if wall else '-'} |"
        )
    lines += [
        "",
        "Training rollouts, first -> last iteration (mean ± sd over seeds): the share of GRPO groups whose "
        "rewards differ, searches and repeated searches per episode, purpose words per search, System-1 "
        "compression (raw tokens in per extracted token) and System 2's context tokens.",
        "",
        "| variant | train F1 | groups with signal | searches / episode | repeated searches / episode | "
        "purpose words | System-1 compression | System-2 context tokens | update s / iteration |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in mars.VARIANTS:
        if variant not in runs:
            continue
        tr = [d.dropna(subset=["train_f1"]).set_index("iteration") for d in runs[variant].values()]
        cells = []
        for col in (
            "train_f1",
            "groups_with_signal",
            "searches_per_episode",
            "repeated_searches_per_episode",
            "purpose_words",
            "s1_compression",
            "s2_context_tokens",
        ):
            a, b = [float(t[col].iloc[0]) for t in tr], [float(t[col].iloc[-1]) for t in tr]
            cells.append("-" if np.isnan(a + b).any() else f"{mean_sd(a)} -> {mean_sd(b)}")
        cells.append(mean_sd([float(t["update_s"].mean()) for t in tr], 0))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines += by_hops(qs)
    lines += contrasts(qs)
    lines += funnel(qs)
    return "\n".join(lines) + "\n"


def by_hops(qs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Held-out exact match by hop count at every evaluation, for the variants whose questions mix hops."""
    mixed = {v: runs for v, runs in qs.items() if any(q["hops"].nunique() > 1 for q in runs.values())}
    if not mixed:
        return []
    lines = [
        "",
        "Held-out exact match by hops (questions of each hop count, mean ± sd over seeds), at every evaluation.",
        "",
        "| variant | seeds | hops | questions | held-out EM by iteration |",
        "|---|---|---|---|---|",
    ]
    for variant, runs in mixed.items():
        seeds = sorted(runs)
        for h in sorted(set().union(*(set(q["hops"]) for q in runs.values()))):
            per_seed = [runs[s][runs[s]["hops"] == h].groupby("iteration")["em"] for s in seeds]
            its = sorted(set.intersection(*(set(g.groups) for g in per_seed)))
            curve = ", ".join(f"{it}: {mean_sd([float(g.mean()[it]) for g in per_seed])}" for it in its)
            n = int(per_seed[0].size().iloc[0])
            lines.append(f"| {variant} | {', '.join(map(str, seeds))} | {h} | {n} | {curve} |")
    return lines


def contrasts(qs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Table lines: for each of `mars.CONTRASTS` run on common seeds, the held-out exact match of one variant minus
    the other's, question by question, at the first and the last evaluation (mean over seeds, 95% bootstrap
    interval over seeds and questions)."""
    lines = [
        "",
        "The paper's comparisons: held-out exact match of the first variant minus the second's, paired by "
        "question on the seeds both ran.",
        "",
        "| comparison | seeds | untrained | after training |",
        "|---|---|---|---|",
    ]
    for a, b in mars.CONTRASTS:
        seeds = sorted(set(qs.get(a, {})) & set(qs.get(b, {})))
        if not seeds:
            continue
        cells = []
        for end in (0, -1):
            diffs = []
            for s in seeds:
                qa, qb = qs[a][s], qs[b][s]
                it = sorted(set(qa["iteration"]) & set(qb["iteration"]))[end]
                diffs.append(paired(*(q[q["iteration"] == it].set_index("task_id")["em"] for q in (qa, qb))))
            mean, lo, hi = seed_bootstrap(diffs)
            cells.append(f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        lines.append(f"| {a} − {b} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    return lines


def funnel(qs: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """Table lines: by variant and answer kind, at the first and last evaluation, the share of held-out
    questions whose answer a search retrieved, System 2 read (found), and System 2 answered when it had read
    it; mean ± sd over the seeds whose per-question tables have those columns."""
    lines = [
        "",
        "Where held-out answers are lost, first -> last evaluation: retrieved (the answer is in the search "
        "results), found (it is in what System 2 read: System 1's findings, or the truncated raw text), and "
        "exact match among the questions where it was found; year replies: System 2's answers that are a year, "
        "whatever the question asked (seeds whose files have the column).",
        "",
        "| variant | seeds | kind | retrieved | found | EM when found | year replies |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in mars.VARIANTS:
        tables = {s: q for s, q in qs.get(variant, {}).items() if "found" in q}
        if not tables:
            continue
        seeds = ", ".join(map(str, sorted(tables)))
        for kind in ("name", "year"):
            of_kind = [q[q["kind"] == kind] for q in tables.values()]
            if not all(len(q) for q in of_kind):
                continue
            cells = []
            for col in ("retrieved", "found", "em_found", "year_reply"):
                ends = []
                for q in of_kind:
                    if col == "year_reply" and col not in q:  # a file written before the column
                        continue
                    its = sorted(q["iteration"].unique())
                    at = [q[q["iteration"] == it] for it in (its[0], its[-1])]
                    ends.append([x["em"][x["found"] == 1].mean() if col == "em_found" else x[col].mean() for x in at])
                # a seed with no found question at an evaluation has no EM-when-found there
                first, last = [[e[i] for e in ends if not np.isnan(e[i])] for i in (0, 1)]
                cells.append(f"{mean_sd(first) if first else '-'} -> {mean_sd(last) if last else '-'}")
            lines.append(f"| {variant} | {seeds} | {kind} | " + " | ".join(cells) + " |")
    return lines
