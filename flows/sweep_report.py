"""`teamrl report FILE`: a sweep's variants and contrasts from its runs' records (flows/sweep_record.py),
as report.md, CSV files and two plots, with each contrast's verdict made by one stated rule
(tasks/evaluation.py `verdict`), never by hand.

Per variant: the metric by iteration (mean ± sd over seeds), each seed's final value, the gain from the
untrained team (per seed, paired by question), the final value on each extra problem set, and wall time.
Per contrast A − B, on the held-out split and each problem set: each seed's A, B and paired difference,
their mean ± sd, a Student-t interval over seeds (what the verdict reads), the bootstrap over seeds and,
within each, questions, and rliable's probability of improvement P(A > B) over seeds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flows.sweep_compare import HELDOUT, Records, contrast, final_iteration, gain, group_values
from flows.sweep_plots import plot_curves, plot_forest
from flows.sweep_spec import SweepSpec
from tasks.evaluation import MIN_SEEDS, clopper_pearson

VERDICT_RULE = (
    f"A difference is **shown** only with at least {MIN_SEEDS} seeds and a seed-level 95% interval "
    "(Student-t over the per-seed differences) that excludes 0; `shown reversed` where it lies below 0; "
    "otherwise `not settled`, or `not shown` where the estimate is <= 0."
)


# --- formatting ---------------------------------------------------------------------------------------------


def pm(values, digits: int = 2) -> str:
    """mean ± sd over seeds, or the one value with `(one seed)`."""
    v = np.asarray([x for x in values if not np.isnan(x)], dtype=float)
    if v.size == 0:
        return "-"
    if v.size == 1:
        return f"{v[0]:.{digits}f} (one seed)"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def signed(x: float) -> str:
    return "-" if np.isnan(x) else f"{x:+.2f}"


def mean_sd(summary: dict) -> str:
    """A difference's mean ± sd over seeds (the mean alone for one seed)."""
    sd = summary["sd"]
    return signed(summary["mean"]) + ("" if np.isnan(sd) else f" ± {sd:.2f}")


def interval(lo: float, hi: float) -> str:
    return "-" if np.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]"


def seed_list(seeds: list[int]) -> str:
    return ", ".join(map(str, sorted(seeds))) or "none"


# --- the report ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    markdown: str
    tables: dict[str, pd.DataFrame]  # file stem -> table (written as CSV)
    claims: list[dict]  # one per contrast with a claim


def variant_rows(rec: Records) -> tuple[list[dict], list[str]]:
    """The variants table's rows, and the notes on rates at 0 or 1 (with their exact intervals)."""
    spec, m = rec.spec, rec.spec.report.metric
    rows, exact = [], []
    for v in spec.variants:
        seeds = rec.seeds(v)
        if not seeds:
            rows.append({"variant": v, "seeds": "none"})
            continue
        its = sorted({i for s in seeds for i in rec.iterations(v, s, HELDOUT)})
        by_it = {
            i: [rec.questions(v, s, HELDOUT, i, m).mean() for s in seeds if i in rec.iterations(v, s, HELDOUT)]
            for i in its
        }
        finals = {s: rec.questions(v, s, HELDOUT, final_iteration(rec, v, s), m) for s in seeds}
        g = gain(rec, v, m).summary()
        row = {
            "variant": v,
            "seeds": seed_list(seeds),
            f"held-out {m} by iteration": ", ".join(
                f"{i}: {pm(x)}" + (f" ({len(x)} of {len(seeds)} seeds)" if 1 < len(x) < len(seeds) else "")
                for i, x in by_it.items()
            ),
            "final per seed": ", ".join(f"s{s}: {q.mean():.2f}" for s, q in finals.items()),
            "gain (t 95%; bootstrap 95%)": f"{signed(g['mean'])} ({interval(g['t_low'], g['t_high'])}; "
            f"{interval(g['boot_low'], g['boot_high'])})",
        }
        for name in spec.problems:
            row[f"{name} final"] = pm(
                [rec.questions(v, s, name, it, m).mean() for s in seeds for it in rec.iterations(v, s, name)[-1:]]
            )
        for extra in spec.report.also:
            row[f"{extra} before -> after"] = before_after(
                rec, v, seeds, lambda s, i, x=extra, v=v: rec.questions(v, s, HELDOUT, i, x)
            )
        for grp in spec.report.groups:
            row[f"{m} on {grp}"] = before_after(
                rec, v, seeds, lambda s, i, g=grp, v=v: group_values(rec, v, s, i, m, g)
            )
        walls = [rec.meta[(v, s)].get("wall_s", np.nan) / 60 for s in seeds]
        row["wall per run (min)"] = pm(walls, 0)
        rows.append(row)
        for s, q in finals.items():
            q = q.dropna()
            if len(q) and q.mean() in (0.0, 1.0) and set(q.unique()) <= {0.0, 1.0}:
                lo, hi = clopper_pearson(int(q.sum()), len(q))
                exact.append(f"{v} seed {s}: {int(q.sum())} of {len(q)}, exact 95% interval [{lo:.2f}, {hi:.2f}]")
    return rows, exact


def before_after(rec: Records, v: str, seeds: list[int], values) -> str:
    first = [values(s, rec.iterations(v, s, HELDOUT)[0]).mean() for s in seeds]
    last = [values(s, final_iteration(rec, v, s)).mean() for s in seeds]
    return f"{pm(first)} -> {pm(last)}"


def contrast_tables(rec: Records) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per contrast and split: the summary row; and the per-seed rows."""
    m = rec.spec.report.metric
    rows, per_seed = [], []
    for c in rec.spec.contrasts:
        for split in [HELDOUT, *rec.spec.problems]:
            d, it = contrast(rec, c, split, m)
            rows.append({"contrast": f"{c.a} − {c.b}", "split": split, "iteration": it, **d.summary()})
            per_seed += [
                {"contrast": f"{c.a} − {c.b}", "split": split, "seed": s, "a": x, "b": y, "difference": x - y}
                for s, x, y in zip(d.seeds, d.a, d.b)
            ]
    return pd.DataFrame(rows), pd.DataFrame(per_seed, columns=["contrast", "split", "seed", "a", "b", "difference"])


def markdown_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    cols = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return out + ["| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |" for r in rows]


def build(spec: SweepSpec, file: str) -> Report:
    """The report of the sweep `spec` (read from `file`) from its records; nothing is run."""
    rec = Records.load(spec)
    m = spec.report.metric
    lines = [f"# Sweep `{spec.name}`", ""]
    if spec.description:
        lines += [spec.description, ""]
    total = len(spec.cells())
    lines += [
        f"Generated by `teamrl report {file}` from the records in `{spec.records_dir()}` "
        f"({len(rec.tables)} of {total} runs recorded); the runs: `teamrl sweep {file}`.",
        "",
        f"- Base: `{spec.base}`{' with ' + ' '.join(f'`{s}`' for s in spec.set) if spec.set else ''}; "
        f"held-out metric: `{m}` (greedy, per question).",
    ]
    lines += provenance_lines(rec)
    missing = [spec.run_id(v, s) for v, s in spec.cells() if (v, s) not in rec.tables]
    if missing:
        lines += [f"- Not recorded yet: {', '.join(missing)}."]
    vrows, exact = variant_rows(rec)
    lines += ["", "## Variants", ""]
    lines += [f"- `{v}`: {' '.join(f'`{o}`' for o in spec.variants[v]) or 'the base'}" for v in spec.variants]
    lines += [""] + markdown_table(vrows)
    if exact:
        lines += ["", "Rates at 0 or 1 (a bootstrap cannot vary them): " + "; ".join(exact) + "."]
    summary, per_seed = contrast_tables(rec)
    claims = []
    if len(summary):
        lines += ["", "## Contrasts", "", VERDICT_RULE, ""]
        lines += [
            "Each seed's difference is the mean over questions of A − B, paired by question; the bootstrap "
            "resamples seeds and, within each, questions; P(A > B) is rliable's probability of improvement "
            "over seeds (Mann-Whitney, unpaired).",
            "",
        ]
        rows = []
        for r in summary.to_dict("records"):
            ps = per_seed[(per_seed["contrast"] == r["contrast"]) & (per_seed["split"] == r["split"])]
            rows.append(
                {
                    "A − B": r["contrast"],
                    "split": r["split"],
                    "iteration": "-" if r["iteration"] is None or pd.isna(r["iteration"]) else int(r["iteration"]),
                    "per seed (A / B / A − B)": "; ".join(
                        f"s{int(x.seed)}: {x.a:.2f} / {x.b:.2f} / {x.difference:+.2f}" for x in ps.itertuples()
                    )
                    or "-",
                    "mean ± sd": mean_sd(r),
                    "seed-level 95% (t)": interval(r["t_low"], r["t_high"]),
                    "seed × question bootstrap 95%": interval(r["boot_low"], r["boot_high"]),
                    "P(A > B)": "-" if np.isnan(r["p_improvement"]) else f"{r['p_improvement']:.2f}",
                    "verdict": r["verdict"],
                }
            )
        lines += markdown_table(rows)
        for c in spec.contrasts:
            if c.claim:
                r = summary[(summary["contrast"] == f"{c.a} − {c.b}") & (summary["split"] == HELDOUT)].iloc[0]
                seeds = per_seed[(per_seed["contrast"] == f"{c.a} − {c.b}") & (per_seed["split"] == HELDOUT)]["seed"]
                claims.append(
                    {
                        "claim": c.claim,
                        "paper": c.paper,
                        "here": f"{mean_sd(r)} held-out {m}, "
                        f"{interval(r['t_low'], r['t_high'])} (seeds {seed_list(list(seeds))})",
                        "verdict": r["verdict"],
                        "sweep": spec.name,
                    }
                )
    for gc in spec.report.gains:
        g = gain(rec, gc.variant, m)
        r = g.summary()
        claims.append(
            {
                "claim": gc.claim,
                "paper": gc.paper,
                "here": f"{mean_sd(r)} held-out {m} after training, "
                f"{interval(r['t_low'], r['t_high'])} (seeds {seed_list(g.seeds)})",
                "verdict": r["verdict"],
                "sweep": spec.name,
            }
        )
    lines += ["", "![learning curves](curves.png)", ""]
    if len(summary):
        lines += ["![contrasts](forest.png)", ""]
    tables = {"variants": pd.DataFrame(vrows), "contrasts": summary, "contrast_seeds": per_seed, "curves": curves(rec)}
    return Report("\n".join(lines), tables, claims)


def provenance_lines(rec: Records) -> list[str]:
    commits = sorted(
        {(m.get("commit") or "unknown")[:7] + (" (modified)" if m.get("dirty") else "") for m in rec.meta.values()}
    )
    machines = sorted({m.get("machine", "unknown") for m in rec.meta.values()})
    notes = sorted({m["note"] for m in rec.meta.values() if m.get("note")})
    out = []
    if commits:
        out.append(f"- Code: {', '.join(commits)}; machine: {'; '.join(machines)}.")
    out += [f"- Note: {n}" for n in notes]
    return out


def curves(rec: Records) -> pd.DataFrame:
    """Per variant, seed and iteration: the held-out metric (mean over questions) and training success."""
    m = rec.spec.report.metric
    rows = []
    order = list(rec.spec.variants)
    for (v, s), _ in sorted(rec.tables.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        for i in rec.iterations(v, s, HELDOUT):
            rows.append(
                {
                    "variant": v,
                    "seed": s,
                    "iteration": i,
                    "series": f"held-out {m}",
                    "value": rec.questions(v, s, HELDOUT, i, m).mean(),
                }
            )
        for i, x in rec.train_curve(v, s).items():
            rows.append({"variant": v, "seed": s, "iteration": int(i), "series": "training success", "value": x})
    return pd.DataFrame(rows, columns=["variant", "seed", "iteration", "series", "value"])


def write(report: Report, out: Path) -> list[Path]:
    """report.md, the CSV files and the plots in `out`; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.md"]
    files[0].write_text(report.markdown)
    for stem, df in report.tables.items():
        df.to_csv(out / f"{stem}.csv", index=False, float_format="%.6g")
        files.append(out / f"{stem}.csv")
    plot_curves(report.tables["curves"], out / "curves.png")
    files.append(out / "curves.png")
    if len(report.tables["contrasts"]):
        plot_forest(report.tables["contrasts"], out / "forest.png")
        files.append(out / "forest.png")
    (out / "claims.json").write_text(json.dumps(report.claims, indent=1, ensure_ascii=False) + "\n")
    files.append(out / "claims.json")
    return files
