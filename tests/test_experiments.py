"""The sweep files of experiments/: every one loads (each run's config validates), and the legacy families'
records (experiments/records/*-2026-11, converted from the figures the removed hand-built runners of
benchmarks/ committed) give `teamrl report` the numbers those runners printed (now archived in
docs/results/legacy-tables.md), printed the same way. Reads only the records: no training, no Prefect server."""

from pathlib import Path

import pytest

from flows import sweep_compare, sweep_report
from flows.sweep_spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
# teamtr-no-tr is TeamTR without its trust region, on purpose
pytestmark = pytest.mark.filterwarnings("ignore:algorithm.strategy=teamtr with kl_delta=null")


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_sweep_file_loads(path):
    spec = load_sweep(path)
    assert spec.cells()


_REPORTS: dict[str, sweep_report.Report] = {}


def report(name: str) -> sweep_report.Report:
    """The report of experiments/<name>.yaml, built once."""
    if name not in _REPORTS:
        path = EXPERIMENTS / f"{name}.yaml"
        _REPORTS[name] = sweep_report.build(load_sweep(path), str(path))
    return _REPORTS[name]


def variant(name: str, v: str) -> dict:
    rows = report(name).tables["variants"]
    return rows[rows["variant"] == v].iloc[0].to_dict()


def contrast(name: str, a: str, b: str, split: str = "heldout") -> dict:
    rows = report(name).tables["contrasts"]
    return rows[(rows["contrast"] == f"{a} − {b}") & (rows["split"] == split)].iloc[0].to_dict()


def boot(row: dict) -> str:
    """A difference as the README prints it: the mean and the seed × question bootstrap's 95% interval."""
    return f"{row['mean']:+.2f} [{row['boot_low']:+.2f}, {row['boot_high']:+.2f}]"


def gain(name: str, v: str) -> str:
    """A variant's gain (final − untrained, paired by question) with its bootstrap interval, as the README
    prints it (the report's variants table prints the Student-t interval instead)."""
    spec = load_sweep(EXPERIMENTS / f"{name}.yaml")
    return boot(sweep_compare.gain(sweep_compare.Records.load(spec), v, spec.report.metric).summary())


# --- legacy-tables.md: "TeamTR ablations over seeds" and "Coaching with and without the answer" ---------------


def test_teamtr_ablations_reproduce_the_published_table():
    joint, teamtr = variant("teamtr-ablations", "joint"), variant("teamtr-ablations", "teamtr")
    assert joint["seeds"] == "0, 1, 2"
    assert joint["held-out success by iteration"] == "0: 0.23 ± 0.02, 2: 0.41 ± 0.10, 4: 0.56 ± 0.10"
    assert joint["final per seed"] == "s0: 0.48, s1: 0.52, s2: 0.67"
    assert teamtr["held-out success by iteration"] == "0: 0.23 ± 0.02, 2: 0.30 ± 0.04, 4: 0.48 ± 0.10"
    assert variant("teamtr-ablations", "stale")["final per seed"] == "s0: 0.46, s1: 0.40"
    rq1 = variant("teamtr-ablations", "teamtr-rq1")["held-out success by iteration"]
    assert rq1 == "0: 0.21 (one seed), 2: 0.25 (one seed), 4: 0.21 (one seed)"
    # the paired differences: held-out after, paraphrased after
    assert boot(contrast("teamtr-ablations", "teamtr", "joint")) == "-0.07 [-0.25, +0.07]"
    assert boot(contrast("teamtr-ablations", "teamtr", "joint", "paraphrased")) == "-0.06 [-0.26, +0.14]"
    assert boot(contrast("teamtr-ablations", "stale", "joint", "paraphrased")) == "-0.19 [-0.33, -0.06]"
    assert boot(contrast("teamtr-ablations", "teamtr", "stale")) == "+0.10 [-0.03, +0.24]"
    assert boot(contrast("teamtr-ablations", "teamtr", "teamtr-no-tr")) == "+0.14 [+0.06, +0.21]"
    assert boot(contrast("teamtr-ablations", "teamtr-rq1", "joint-q10")) == "-0.17 [-0.28, -0.05]"
    assert boot(contrast("teamtr-ablations", "teamtr-rq1", "joint-q10", "paraphrased")) == "-0.19 [-0.31, -0.08]"


def test_a_variant_name_with_a_dot_reproduces_too():
    d = variant("teamtr-ablations", "teamtr-d0.01")
    assert d["seeds"] == "0"
    assert d["held-out success by iteration"] == "0: 0.21 (one seed), 2: 0.26 (one seed), 4: 0.45 (one seed)"
    assert boot(contrast("teamtr-ablations", "teamtr-d0.01", "joint")) == "-0.03 [-0.13, +0.07]"
    assert boot(contrast("teamtr-ablations", "teamtr-d0.01", "teamtr", "paraphrased")) == "+0.06 [-0.04, +0.16]"


def test_coaches_reproduce_the_published_table():
    rows = {v: variant("coaches-2026-11", v) for v in ("joint", "blind", "outcome")}
    after = {v: r["held-out success by iteration"].rsplit("4: ", 1)[1] for v, r in rows.items()}
    assert after == {"joint": "0.56 ± 0.10", "blind": "0.46 ± 0.10", "outcome": "0.33 ± 0.23"}
    assert {v: r["paraphrased final"] for v, r in rows.items()} == {
        "joint": "0.36 ± 0.11",
        "blind": "0.23 ± 0.02",
        "outcome": "0.21 ± 0.13",
    }
    assert variant("coaches-2026-11", "llm")["seeds"] == "none"
    assert gain("coaches-2026-11", "joint") == "+0.33 [+0.24, +0.42]"
    assert gain("coaches-2026-11", "outcome") == "+0.10 [-0.14, +0.26]"
    assert boot(contrast("coaches-2026-11", "joint", "blind")) == "+0.09 [-0.06, +0.28]"
    assert boot(contrast("coaches-2026-11", "joint", "outcome")) == "+0.23 [+0.09, +0.41]"
    assert boot(contrast("coaches-2026-11", "joint", "outcome", "paraphrased")) == "+0.15 [-0.04, +0.41]"
    assert boot(contrast("coaches-2026-11", "blind", "outcome", "paraphrased")) == "+0.02 [-0.10, +0.16]"
    # joint's runs are the ablations' own: one record, two sweeps
    assert variant("coaches-2026-11", "joint") == variant("teamtr-ablations", "joint")


# --- "MARS over seeds" ------------------------------------------------------------------------------------------


def test_mars_reproduces_the_published_table():
    shared = variant("mars-variants", "shared")
    assert shared["held-out em by iteration"] == "0: 0.25 ± 0.04, 2: 0.26 ± 0.03, 4: 0.30 ± 0.11, 6: 0.31 ± 0.01"
    assert shared["f1 before -> after"] == "0.25 ± 0.04 -> 0.31 ± 0.01"
    assert shared["em on group/year"] == "0.67 ± 0.07 -> 0.76 ± 0.02"
    assert shared["em on group/name"] == "0.03 ± 0.00 -> 0.07 ± 0.06"
    assert shared["wall per run (min)"] == "97 ± 13"
    positive = variant("mars-variants", "short-docs-positive")
    assert positive["seeds"] == "0, 1, 2"
    assert positive["held-out em by iteration"] == "0: 0.31 ± 0.07, 2: 0.39 ± 0.05, 4: 0.39 ± 0.04, 6: 0.35 ± 0.08"
    assert variant("mars-variants", "separate")["seeds"] == "none"  # never run
    assert gain("mars-variants", "shared") == "+0.06 [-0.03, +0.15]"
    assert gain("mars-variants", "short-docs-names") == "-0.38 [-0.52, -0.24]"
    # the paper's comparisons, after training
    assert boot(contrast("mars-variants", "short-docs", "short-docs-no-system1")) == "+0.03 [-0.10, +0.15]"
    assert boot(contrast("mars-variants", "short-docs-positive", "short-docs")) == "+0.10 [-0.01, +0.24]"
    two_search = contrast("mars-variants", "short-docs-positive-two-search", "short-docs-positive-hops12")
    assert boot(two_search) == "-0.04 [-0.13, +0.05]"


# --- "DSBench over seeds" ---------------------------------------------------------------------------------------


def test_dsbench_reproduces_the_published_table():
    unseen = variant("dsbench-unseen", "unseen")
    assert unseen["held-out success by iteration"] == "0: 0.38 ± 0.00, 6: 1.00 ± 0.00"
    assert unseen["submission_ok before -> after"] == "0.38 ± 0.00 -> 1.00 ± 0.00"
    assert unseen["success on group/digits"] == "0.00 ± 0.00 -> 1.00 ± 0.00"
    assert unseen["success on group/synthetic_regression_3"] == "1.00 ± 0.00 -> 1.00 ± 0.00"
    assert unseen["wall per run (min)"] == "102 ± 2"
    assert gain("dsbench-unseen", "unseen") == "+0.62 [+0.48, +0.77]"
    assert "2 of 2 runs recorded" in report("dsbench-unseen").markdown


def test_the_published_reports_and_the_readme_claims_table_are_generated_from_the_records(tmp_path, monkeypatch):
    from flows import results

    monkeypatch.chdir(ROOT)
    assert results.stale(tmp_path) == [], "stale: run `.venv/bin/python -m flows.results`"
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
