"""The few-seed statistics of `teamrl report` against hand-computed values, and its verdict rule on hand-made
records: two seeds never give `shown`, an interval across 0 gives `not settled`, an estimate <= 0 `not shown`,
and three seeds whose interval excludes 0 give `shown`."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.sweep_record import RECORD_COLUMNS, RECORD_VERSION
from flows.sweep_report import build
from flows.sweep_spec import load_sweep
from tasks.evaluation import clopper_pearson, seed_bootstrap, t_interval, verdict

T_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom


def test_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    lo, hi = t_interval([0.1, 0.2, 0.3])  # mean 0.2, sd 0.1, n 3
    half = T_2 * 0.1 / math.sqrt(3)
    assert lo == pytest.approx(0.2 - half) and hi == pytest.approx(0.2 + half)
    assert t_interval([0.4, 0.4]) == (0.4, 0.4)  # no spread: the mean itself
    assert all(math.isnan(x) for x in t_interval([0.3]))  # one seed: no interval


def test_clopper_pearson_at_rates_0_and_1_is_the_beta_quantile():
    # k = 0: [0, 1 - (alpha/2)^(1/n)]; k = n: [(alpha/2)^(1/n), 1]
    assert clopper_pearson(0, 8) == pytest.approx((0.0, 1 - 0.025 ** (1 / 8)))
    assert clopper_pearson(24, 24) == pytest.approx((0.025 ** (1 / 24), 1.0))
    assert round(clopper_pearson(24, 24)[0], 2) == 0.86  # DSBench's 24 of 24 is [0.86, 1.00], not [1.00, 1.00]


def test_seed_bootstrap_of_identical_seeds_is_the_question_bootstrap_and_its_estimate_the_mean_of_means():
    d = [np.array([1.0, 0.0, 0.0, 1.0]), np.array([1.0, 1.0])]
    est, lo, hi = seed_bootstrap(d)
    assert est == pytest.approx((0.5 + 1.0) / 2)
    assert 0.0 <= lo <= est <= hi <= 1.0
    same = [np.array([0.25, 0.25])] * 3
    assert seed_bootstrap(same) == pytest.approx((0.25, 0.25, 0.25))


@pytest.mark.parametrize(
    "n, mean, lo, hi, want",
    [
        (3, 0.32, 0.27, 0.37, "shown"),
        (2, 0.32, 0.27, 0.37, "not settled"),  # two seeds never give `shown`
        (5, 0.10, -0.02, 0.22, "not settled"),
        (5, -0.01, -0.10, 0.08, "not shown"),
        (4, -0.20, -0.30, -0.10, "shown reversed"),
        (2, -0.20, -0.30, -0.10, "not shown"),
        (3, 0.0, 0.0, 0.0, "not shown"),
    ],
)
def test_the_verdict_rule(n, mean, lo, hi, want):
    assert verdict(n, mean, lo, hi) == want


def make_sweep(tmp_path, a_rates: dict[int, float], b_rates: dict[int, float], questions: int = 50):
    """A sweep file with variants a and b and hand-made records: per seed, `questions` held-out questions of
    which the first rate·n succeed after one iteration (none before), and the same on a problem set `p`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "p.jsonl").write_text("")
    spec = {
        "name": "hand",
        "base": "tiny",
        "variants": {"a": [], "b": ["coach.ground_truth=false"]},
        "seeds": sorted(a_rates),
        "contrasts": [{"a": "a", "b": "b", "claim": "a beats b", "paper": "MAPPA"}],
        "iterations": 1,
        "problems": {"p": "p.jsonl"},
    }
    path = tmp_path / "hand.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "records" / "hand"
    out.mkdir(parents=True)
    for variant, rates in (("a", a_rates), ("b", b_rates)):
        for seed, rate in rates.items():
            rows = []
            for q in range(questions):
                ok = float(q < round(rate * questions))
                rows += [("heldout", 0, f"q{q:02d}", "success", 0.0), ("heldout", 1, f"q{q:02d}", "success", ok)]
                rows.append(("p", 1, f"q{q:02d}", "success", ok))
            rows.append(("train", 1, "", "success_rate", rate))
            pd.DataFrame(rows, columns=RECORD_COLUMNS).to_csv(out / f"{variant}-s{seed}.csv", index=False)
            meta = {"record_version": RECORD_VERSION, "wall_s": 60.0, "commit": "abc1234", "machine": "here"}
            (out / f"{variant}-s{seed}.json").write_text(json.dumps(meta))
    return load_sweep(path), str(path)


def contrast_row(report, split="heldout"):
    c = report.tables["contrasts"]
    return c[c["split"] == split].iloc[0]


def test_three_seeds_whose_interval_excludes_0_are_shown_with_hand_computed_figures(tmp_path):
    spec, file = make_sweep(tmp_path, {0: 0.60, 1: 0.62, 2: 0.64}, {0: 0.30, 1: 0.30, 2: 0.30})
    report = build(spec, file)
    r = contrast_row(report)
    assert r["seeds"] == 3 and r["iteration"] == 1
    assert r["mean"] == pytest.approx(0.32) and r["sd"] == pytest.approx(0.02)
    half = T_2 * 0.02 / math.sqrt(3)
    assert (r["t_low"], r["t_high"]) == pytest.approx((0.32 - half, 0.32 + half))
    assert r["p_improvement"] == pytest.approx(1.0)  # every seed of a above every seed of b
    assert r["verdict"] == "shown"
    seeds = report.tables["contrast_seeds"]
    assert seeds[seeds["split"] == "heldout"]["difference"].tolist() == pytest.approx([0.30, 0.32, 0.34])
    assert report.claims == [
        {
            "claim": "a beats b",
            "paper": "MAPPA",
            "here": "+0.32 ± 0.02 held-out success, [+0.27, +0.37] (seeds 0, 1, 2)",
            "verdict": "shown",
            "sweep": "hand",
        }
    ]
    v = report.tables["variants"].set_index("variant")
    assert v.loc["a", "held-out success by iteration"] == "0: 0.00 ± 0.00, 1: 0.62 ± 0.02"
    assert v.loc["a", "gain (t 95%; bootstrap 95%)"].startswith("+0.62 ")
    assert "**shown**" in report.markdown and "| a − b | heldout | 1 |" in report.markdown


def test_two_seeds_are_never_shown_however_far_apart(tmp_path):
    report = build(*make_sweep(tmp_path, {0: 0.90, 1: 0.92}, {0: 0.10, 1: 0.10}))
    assert contrast_row(report)["verdict"] == "not settled"


def test_an_interval_across_0_is_not_settled_and_an_estimate_at_or_below_0_not_shown(tmp_path):
    # differences +0.20, -0.10, +0.10 (mean +0.067) across 0; then the same runs the other way round
    a, b = {0: 0.50, 1: 0.30, 2: 0.40}, {0: 0.30, 1: 0.40, 2: 0.30}
    assert contrast_row(build(*make_sweep(tmp_path / "x", a, b)))["verdict"] == "not settled"
    assert contrast_row(build(*make_sweep(tmp_path / "y", b, a)))["verdict"] == "not shown"


def test_a_rate_of_0_or_1_gets_an_exact_interval(tmp_path):
    report = build(*make_sweep(tmp_path, {0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.0, 1: 0.2, 2: 0.4}, questions=24))
    assert "a seed 0: 24 of 24, exact 95% interval [0.86, 1.00]" in report.markdown
    assert "b seed 0: 0 of 24, exact 95% interval [0.00, 0.14]" in report.markdown


def test_missing_runs_are_named_and_an_unknown_record_version_refused(tmp_path):
    from infra.errors import UsageError

    spec, file = make_sweep(tmp_path, {0: 0.5, 1: 0.5}, {0: 0.4, 1: 0.4})
    (spec.records_dir() / "b-s1.csv").unlink()
    assert "Not recorded yet: hand-b-s1." in build(spec, file).markdown
    (spec.records_dir() / "a-s1.json").write_text(json.dumps({"record_version": 99}))
    with pytest.raises(UsageError, match="record version 99"):
        build(spec, file)
