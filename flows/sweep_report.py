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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flows.sweep_record import read_record, record_paths
from flows.sweep_spec import Contrast, SweepSpec
from tasks.evaluation import MIN_SEEDS, clopper_pearson, seed_bootstrap, t_interval, verdict

HELDOUT = "heldout"
VERDICT_RULE = (
    f"A difference is **shown** only with at least {MIN_SEEDS} seeds and a seed-level 95% interval "
    "(Student-t over the per-seed differences) that excludes 0; `shown reversed` where it lies below 0; "
    "otherwise `not settled`, or `not shown` where the estimate is <= 0."
)


@dataclass
class Records:
    """The sweep's recorded runs: (variant, seed) -> record table, and -> its provenance."""

    spec: SweepSpec
    tables: dict[tuple[str, int], pd.DataFrame] = field(default_factory=dict)
    meta: dict[tuple[str, int], dict] = field(default_factory=dict)

    @classmethod
    def load(cls, spec: SweepSpec) -> Records:
        out = cls(spec)
        for v, s in spec.cells():
            csv, js = record_paths(spec, v, s)
            if csv.exists():
                out.tables[(v, s)] = read_record(csv)
                out.meta[(v, s)] = json.loads(js.read_text())
        return out

    def seeds(self, variant: str) -> list[int]:
        return [s for v, s in self.tables if v == variant]

    def questions(self, variant: str, seed: int, split: str, iteration: int, metric: str) -> pd.Series:
        """task_id -> the metric of that question (NaN: not measured), at one iteration of one split."""
        df = self.tables[(variant, seed)]
        sel = df[(df["split"] == split) & (df["iteration"] == iteration) & (df["metric"] == metric)]
        return sel.set_index("item")["value"].astype(float)

    def iterations(self, variant: str, seed: int, split: str) -> list[int]:
        df = self.tables[(variant, seed)]
        return sorted(int(i) for i in df.loc[df["split"] == split, "iteration"].unique())

    def train_curve(self, variant: str, seed: int, metric: str = "success_rate") -> pd.Series:
        df = self.tables[(variant, seed)]
        sel = df[(df["split"] == "train") & (df["metric"] == metric)]
        return sel.set_index("iteration")["value"].astype(float)


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


# --- statistics over records --------------------------------------------------------------------------------


@dataclass
class Difference:
    """A paired difference over seeds: per seed the mean over questions of x − y, with both sides' means."""

    seeds: list[int]
    a: list[float]
    b: list[float]
    per_seed: list[np.ndarray]  # the paired differences over questions, per seed

    @property
    def diffs(self) -> np.ndarray:
        return np.array([d.mean() for d in self.per_seed])

    def summary(self) -> dict:
        """mean, sd, t interval, seed×question bootstrap, P(A > B) and the verdict."""
        from rliable import metrics as rl

        d = self.diffs
        lo, hi = t_interval(d)
        _, blo, bhi = seed_bootstrap(self.per_seed) if len(d) else (np.nan, np.nan, np.nan)
        poi = (  # over one seed it could only be 0, 1/2 or 1
            float(rl.probability_of_improvement(np.array(self.a)[:, None], np.array(self.b)[:, None]))
            if len(d) > 1
            else np.nan
        )
        mean = float(d.mean()) if len(d) else np.nan
        sd = float(d.std(ddof=1)) if len(d) > 1 else np.nan
        return {
            "seeds": len(d),
            "mean": mean,
            "sd": sd,
            "t_low": lo,
            "t_high": hi,
            "boot_low": blo,
            "boot_high": bhi,
            "p_improvement": poi,
            "verdict": verdict(len(d), mean, lo, hi) if len(d) else "no runs",
        }


def paired(x: pd.Series, y: pd.Series) -> np.ndarray:
    """x[q] − y[q] over the questions q measured in both."""
    return (x - y).dropna().to_numpy(dtype=float)


def final_iteration(rec: Records, variant: str, seed: int) -> int:
    return rec.iterations(variant, seed, HELDOUT)[-1]


def gain(rec: Records, variant: str, metric: str) -> Difference:
    """Final − untrained on the held-out split, per seed, paired by question."""
    seeds, a, b, per = [], [], [], []
    for s in rec.seeds(variant):
        its = rec.iterations(variant, s, HELDOUT)
        if len(its) < 2:
            continue
        after, before = (rec.questions(variant, s, HELDOUT, i, metric) for i in (its[-1], its[0]))
        if (d := paired(after, before)).size:
            seeds.append(s), a.append(after.mean()), b.append(before.mean()), per.append(d)
    return Difference(seeds, a, b, per)


def contrast(rec: Records, c: Contrast, split: str, metric: str) -> tuple[Difference, int | None]:
    """A − B on one split at the final iteration both ran to, over the seeds both have; and that iteration
    (None where the seeds' final iterations differ)."""
    seeds, a, b, per, its = [], [], [], [], set()
    for s in sorted(set(rec.seeds(c.a)) & set(rec.seeds(c.b))):
        ia, ib = rec.iterations(c.a, s, split), rec.iterations(c.b, s, split)
        common = sorted(set(ia) & set(ib))
        if not common:
            continue
        it = common[-1]
        x, y = rec.questions(c.a, s, split, it, metric), rec.questions(c.b, s, split, it, metric)
        if not (d := paired(x, y)).size:  # no question measured in both: nothing to pair on this seed
            continue
        seeds.append(s), a.append(x.mean()), b.append(y.mean()), per.append(d), its.add(it)
    return Difference(seeds, a, b, per), (its.pop() if len(its) == 1 else None)


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


def group_values(rec: Records, v: str, s: int, i: int, metric: str, group: str) -> pd.Series:
    marks = rec.questions(v, s, HELDOUT, i, group)
    return rec.questions(v, s, HELDOUT, i, metric).reindex(marks[marks == 1].index)


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


def plot_curves(df: pd.DataFrame, out: Path) -> None:
    """Per series a panel: each variant's mean over seeds with a ± sd band, and each seed's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(df["series"])) or ["held-out"]
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    for ax, name in zip(axes[0], series):
        sel = df[df["series"] == name]
        for k, (v, g) in enumerate(sel.groupby("variant", sort=False)):
            colour = f"C{k}"
            for _, line in g.groupby("seed"):
                ax.plot(line["iteration"], line["value"], color=colour, alpha=0.3, lw=0.8)
            stat = g.groupby("iteration")["value"].agg(["mean", "std"]).fillna({"std": 0.0})
            ax.plot(stat.index, stat["mean"], "o-", color=colour, label=f"{v} ({g['seed'].nunique()} seeds)")
            ax.fill_between(
                stat.index, stat["mean"] - stat["std"], stat["mean"] + stat["std"], color=colour, alpha=0.15
            )
        ax.set(xlabel="iteration", ylabel=name, title=name)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_forest(summary: pd.DataFrame, out: Path) -> None:
    """Each contrast and split: the mean difference, its seed-level t interval (line) and bootstrap (ticks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows.itertuples()):
        colour = "C2" if str(r.verdict).startswith("shown") else "C0"
        if not np.isnan(r.t_low):
            ax.plot([r.t_low, r.t_high], [yi, yi], color=colour, lw=2)
        if not np.isnan(r.boot_low):
            ax.plot([r.boot_low, r.boot_high], [yi, yi], "|", color="k", ms=10)
        ax.plot([r.mean], [yi], "o", color=colour)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(y, [f"{r.contrast} ({r.split}, {r.seeds} seeds)" for r in rows.itertuples()], fontsize=8)
    ax.set(xlabel="difference A − B (line: seed-level t 95%; ticks: seed × question bootstrap 95%)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


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
