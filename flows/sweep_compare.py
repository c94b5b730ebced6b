"""A sweep's records read back for comparison (flows/sweep_record.py): per (variant, seed) the per-question
values of a split at an iteration, and the paired differences over seeds the report states, a variant's
gain from its untrained team and a contrast A − B, with their statistics (tasks/evaluation.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flows.sweep_record import read_record, record_paths
from flows.sweep_spec import Contrast, SweepSpec
from tasks.evaluation import seed_bootstrap, t_interval, verdict

HELDOUT = "heldout"


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
            seeds.append(s)
            a.append(after.mean())
            b.append(before.mean())
            per.append(d)
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
        seeds.append(s)
        a.append(x.mean())
        b.append(y.mean())
        per.append(d)
        its.add(it)
    return Difference(seeds, a, b, per), (its.pop() if len(its) == 1 else None)


def group_values(rec: Records, v: str, s: int, i: int, metric: str, group: str) -> pd.Series:
    marks = rec.questions(v, s, HELDOUT, i, group)
    return rec.questions(v, s, HELDOUT, i, metric).reindex(marks[marks == 1].index)
