"""Issue 21's evidence tooling (benchmarks/coach_evidence.py, benchmarks/strategies.py): the seed-and-problem
bootstrap against hand-computed values, the report from synthetic per-run CSVs, and the end-of-run writer on a
real tiny run."""

import re
import shutil

import numpy as np
import pandas as pd
import pytest

from benchmarks import strategies, strategies_report
from benchmarks.coach_evidence import paired, seed_bootstrap, write_figures
from pipelines.mathchat.paraphrased import FILE

# --- statistics ------------------------------------------------------------------------------------------------


def test_paired_differences_cover_the_problems_both_have():
    a = pd.Series({"x": 1.0, "y": 0.0, "z": np.nan})
    b = pd.Series({"y": 1.0, "x": 1.0, "w": 0.0})
    assert sorted(paired(a, b)) == [-1.0, 0.0]  # x: 1 - 1, y: 0 - 1; z has no value, w is not in a


@pytest.mark.parametrize(
    "diffs, want",
    [
        # one seed, problems {1, 0}: a resample's mean is 0, 1/2 or 1 (p = 1/4, 1/2, 1/4)
        ([[1, 0]], (0.5, 0.0, 1.0)),
        # seeds weigh alike: (1 + 0) / 2, not the pooled 2 / 5
        ([[1, 1], [0, 0, 0]], (0.5, 0.0, 1.0)),
        # a slot draws seed 0 (mean 0, 1/2, 1 at p 1/4, 1/2, 1/4) or seed 1 (always 1): P(0) = 1/8, P(1/2) = 1/4;
        # a replicate of two slots is 0 at p 1/64 < 2.5% and <= 1/4 at p 5/64, and 1 at p (5/8)^2 > 2.5%
        ([[1, 0], [1, 1]], (0.75, 0.25, 1.0)),
        ([[0.2, 0.2], [0.2]], (0.2, 0.2, 0.2)),
    ],
)
def test_seed_bootstrap_hand_computed(diffs, want):
    assert seed_bootstrap([np.array(d, dtype=float) for d in diffs]) == pytest.approx(want)


def test_seed_bootstrap_is_seeded():
    diffs = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0])]
    assert seed_bootstrap(diffs, seed=3) == seed_bootstrap(diffs, seed=3)


# --- the report from synthetic CSVs ---------------------------------------------------------------------------

TASKS = ["t1", "t2", "t3", "t4", "t5"]
BEFORE = {0: [1, 0, 0, 0, 0], 1: [0, 1, 0, 0, 0]}  # iteration 0: every coach starts from the same team
AFTER = {
    ("joint", 0): [1, 1, 1, 0, 0],
    ("joint", 1): [1, 1, 1, 1, 0],
    ("blind", 0): BEFORE[0],
    ("blind", 1): BEFORE[1],
    ("outcome", 0): [1, 0, 0, 0, 0],
}
BASE = [0, 0, 1, 0, 0]
PARA = {("joint", 0): [1, 0, 1, 0, 0], ("joint", 1): [1, 1, 1, 0, 0], ("blind", 0): BASE, ("blind", 1): BASE}


def questions(rows: dict[int, list[int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"iteration": it, "task_id": t, "question": f"q {t}?", "success": s}
            for it, succ in rows.items()
            for t, s in zip(TASKS, succ)
        ]
    )


def agents(code_error: tuple[float, float], faithful: tuple[float, float]) -> pd.DataFrame:
    rows = [("rollout", 1, "executor", "code_error", 0.9, 32)]  # training rollouts: not in the before/after table
    for it, c, f in zip((0, 4), code_error, faithful):
        rows += [
            ("eval", it, "executor", "code_error", c, 5),
            ("eval", it, "verifier", "faithful", f, 0 if np.isnan(f) else 2),
        ]
    return pd.DataFrame(rows, columns=["phase", "iteration", "agent", "rate", "value", "episodes"])


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    monkeypatch.setattr(strategies_report, "OUT", tmp_path)
    for (v, s), after in AFTER.items():
        questions({0: BEFORE[s], 4: after}).to_csv(tmp_path / f"{v}-s{s}.questions.csv", index=False)
    for (v, s), succ in PARA.items():
        questions({4: succ}).to_csv(tmp_path / f"{v}-s{s}.paraphrased.csv", index=False)
    questions({0: BASE}).to_csv(tmp_path / "base.paraphrased.csv", index=False)
    agents((0.5, 0.25), (np.nan, 1.0)).to_csv(tmp_path / "joint-s0.agents.csv", index=False)
    agents((0.7, 0.35), (0.5, 0.5)).to_csv(tmp_path / "joint-s1.agents.csv", index=False)
    pd.DataFrame(
        {
            "iteration": [0, 4],
            "heldout_success": [0.2, 0.6],
            "heldout_ci_low": 0.0,
            "heldout_ci_high": 1.0,
            "train_success": [None, 0.3],
            "rollout_episodes": [0, 32],
            "train_episodes": [0, 32],
            "updates": [0, 3],
            "updates_skipped": 0,
            "stage_gain": None,
            "stage_penalty": None,
            "stage_certificate": None,
            "certified_updates": 0,
            "certificates": 0,
        }
    ).to_csv(tmp_path / "joint-s0.csv", index=False)
    return tmp_path


def row(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def interval(cell: str) -> tuple[float, float, float]:
    return tuple(map(float, re.fullmatch(r"([-+.\d]+) \[([-+.\d]+), ([-+.\d]+)\]", cell).groups()))


def test_coach_report_from_synthetic_csvs(synthetic):
    text = strategies_report.coach_report()
    # coach | seeds | final iteration | held-out before | after | gain | paraphrased untrained | after | gain
    joint = row(text, "| joint |")
    assert joint[:5] == ["joint", "0, 1", "4", "0.20 ± 0.00", "0.70 ± 0.14"]  # (0.6 + 0.8) / 2, sd sqrt(0.02)
    gain = interval(joint[5])  # per seed: (0 + 1 + 1 + 0 + 0) / 5 and (1 + 0 + 1 + 1 + 0) / 5
    assert gain[0] == 0.5 and gain[1] <= 0.5 <= gain[2]
    assert joint[6:8] == ["0.20", "0.50 ± 0.14"] and interval(joint[8])[0] == 0.3  # (0.2 + 0.4) / 2
    assert row(text, "| blind |")[3:] == [
        "0.20 ± 0.00",
        "0.20 ± 0.00",
        "+0.00 [+0.00, +0.00]",
        "0.20",
        "0.20 ± 0.00",
        "+0.00 [+0.00, +0.00]",
    ]
    assert row(text, "| outcome |")[1:5] == ["0", "4", "0.20 (one seed)", "0.20 (one seed)"]
    assert row(text, "| outcome |")[7:] == ["-", "-"]  # no paraphrased evaluation yet

    # A − B | seeds | iteration | held-out after | held-out gain | paraphrased after
    jb = row(text, "| joint − blind |")
    assert jb[1:3] == ["0, 1", "4"] and interval(jb[3])[0] == interval(jb[4])[0] == 0.5 and interval(jb[5])[0] == 0.3
    jo = row(text, "| joint − outcome |")
    assert jo[1] == "0" and interval(jo[3])[0] == 0.4 and jo[5] == "-"  # only seed 0 is in both
    assert row(text, "| blind − outcome |")[3] == "+0.00 [+0.00, +0.00]"

    # agent | rate | joint | blind | outcome: held-out (eval) before -> after; a missing value leaves its seed out
    assert row(text, "| executor | code_error |")[2:] == ["0.60 ± 0.14 -> 0.30 ± 0.07", "-", "-"]
    assert row(text, "| verifier | faithful |")[2] == "0.50 (one seed) -> 0.75 ± 0.35"


def test_a_shorter_run_pairs_at_the_last_iteration_both_evaluated(synthetic):
    # llm, seed 0, trained 2 iterations: after [1, 1, 0, 0, 0]; joint seed 0 evaluated at 0, 2 and 4, with
    # [0, 1, 0, 0, 0] at 2: llm − joint at iteration 2 is +1/5 after, and +1/5 in gain (both start at BEFORE[0])
    questions({0: BEFORE[0], 2: [1, 1, 0, 0, 0]}).to_csv(synthetic / "llm-s0.questions.csv", index=False)
    questions({2: [1, 1, 1, 1, 1]}).to_csv(synthetic / "llm-s0.paraphrased.csv", index=False)
    questions({0: BEFORE[0], 2: [0, 1, 0, 0, 0], 4: AFTER[("joint", 0)]}).to_csv(
        synthetic / "joint-s0.questions.csv", index=False
    )
    text = strategies_report.coach_report()
    assert row(text, "| llm |")[1:5] == ["0", "2", "0.20 (one seed)", "0.40 (one seed)"]
    cells = row(text, "| joint − llm |")
    assert cells[1:3] == ["0", "2"] and interval(cells[3])[0] == interval(cells[4])[0] == -0.2
    assert cells[5] == "-"  # the paraphrased set is played by each run's final team: iterations 4 and 2
    assert row(text, "| joint − blind |")[1:3] == ["0, 1", "4"]  # where both ran 4, they pair at 4


def test_the_teamtr_table_reads_only_per_iteration_csvs(synthetic):
    assert {v: sorted(s) for v, s in strategies_report.load().items()} == {"joint": [0]}
    text = strategies_report.report()
    assert row(text, "| joint |")[:2] == ["joint", "0"] and "| blind |" not in text and "| outcome |" not in text


def test_the_teamtr_table_pairs_each_variant_with_joint(synthetic):
    # teamtr, seed 1 only: after [1, 1, 0, 0, 0] against joint's [1, 1, 1, 1, 0] -> -2/5; paraphrased
    # [0, 0, 0, 0, 0] against joint's [1, 1, 1, 0, 0] -> -3/5
    questions({0: BEFORE[1], 4: [1, 1, 0, 0, 0]}).to_csv(synthetic / "teamtr-s1.questions.csv", index=False)
    questions({4: [0, 0, 0, 0, 0]}).to_csv(synthetic / "teamtr-s1.paraphrased.csv", index=False)
    cells = row(strategies_report.report(), "| teamtr − joint |")
    assert cells[1:3] == ["1", "4"] and [interval(c)[0] for c in cells[3:]] == [-0.4, -0.4, -0.6]
    assert "| joint − " not in strategies_report.report()  # joint is the reference, not a row
    # an ablation pair: teamtr-no-tr, seed 1, after [1, 0, 0, 0, 0]: teamtr − teamtr-no-tr = +1/5
    questions({0: BEFORE[1], 4: [1, 0, 0, 0, 0]}).to_csv(synthetic / "teamtr-no-tr-s1.questions.csv", index=False)
    cells = row(strategies_report.report(), "| teamtr − teamtr-no-tr |")
    assert cells[1] == "1" and [interval(c)[0] for c in cells[3:5]] == [0.2, 0.2] and cells[5] == "-"
    assert "| teamtr − stale |" not in strategies_report.report()  # no stale run: no row


def test_report_write_replaces_only_its_sections(synthetic, tmp_path_factory, monkeypatch):
    readme = tmp_path_factory.mktemp("readme") / "README.md"
    other = "## Another benchmark\n\nIts text, untouched.\n"
    readme.write_text(f"# Benchmarks\n\n{other}")
    monkeypatch.setattr(strategies_report, "README", readme)
    monkeypatch.setattr("sys.argv", ["strategies.py", "--report", "--write"])
    strategies.main()
    text = readme.read_text()
    assert other in text and strategies_report.SECTION in text and strategies_report.COACH_SECTION in text
    strategies.main()  # again: each section replaced in place
    assert readme.read_text() == text


def test_no_coach_runs_no_coach_section(tmp_path, monkeypatch):
    monkeypatch.setattr(strategies_report, "OUT", tmp_path)
    assert strategies_report.coach_report().rstrip().endswith("No runs yet.")


def test_backfill_writes_the_figures_of_ended_runs_that_are_here(tmp_path, monkeypatch, capsys):
    out, runs_dir = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    for name in ("joint-s0", "blind-s1"):  # ended: their per-iteration CSV exists
        (out / f"{name}.csv").write_text("iteration\n0\n")
    for rid in ("abl-joint-s0", "abl-outcome-s0"):  # outcome-s0 has not ended; blind-s1 ran elsewhere
        (runs_dir / rid).mkdir(parents=True)
        (runs_dir / rid / "config.yaml").write_text("{}\n")
    calls = []
    monkeypatch.setattr(strategies, "OUT", out)
    monkeypatch.setattr(strategies, "write_figures", lambda run_dir, to, name: calls.append((run_dir.name, to, name)))
    monkeypatch.setattr("sys.argv", ["strategies.py", "--backfill", str(runs_dir)])
    strategies.main()
    assert calls == [("abl-joint-s0", out, "joint-s0")]
    assert f"{runs_dir / 'abl-blind-s1'}: no such run here" in capsys.readouterr().out


# --- the end-of-run writer on a real run ----------------------------------------------------------------------


@pytest.mark.slow
def test_end_of_run_figures_of_a_tiny_run(trained_run, tmp_path):
    """The tiny preset (MathChat) trained 2 iterations, evaluated at 0 and 2: every figure, from its tables,
    and the paraphrased evaluation through `teamrl eval --problems` in a subprocess."""
    from flows.report import run_table
    from infra import store
    from pipelines.mathchat.problems import load_jsonl

    root, source = trained_run
    run_dir = shutil.copytree(source, tmp_path / "runs" / "spine")  # the eval folders go beside the copy
    problems = tmp_path / "three.jsonl"
    problems.write_text("".join(FILE.read_text().splitlines(keepends=True)[:3]))
    out = tmp_path / "out"
    write_figures(run_dir, out, "joint-s1", problems)

    q = pd.read_csv(out / "joint-s1.questions.csv")
    ev = run_table(run_dir).query("phase == 'eval'").set_index("iteration")["success_rate"]
    assert sorted(set(q["iteration"])) == [0, 2] and q.groupby("iteration").size().tolist() == [8, 8]
    assert q.groupby("iteration")["success"].mean().to_dict() == pytest.approx(ev.to_dict())

    a = pd.read_csv(out / "joint-s1.agents.csv")
    parts = a.groupby(["phase", "iteration"]).size()
    assert parts.to_dict() == {("eval", 0): 6, ("eval", 2): 6, ("rollout", 1): 6, ("rollout", 2): 6}
    assert a["value"].dropna().between(0, 1).all()
    eps = store.read_table(run_dir, "episodes", phase="rollout")
    stated = eps.groupby("iteration")["metrics"].agg(lambda m: np.mean([dict(x)["answer_stated"] for x in m]))
    got = a.query("phase == 'rollout' and rate == 'answer_stated'").set_index("iteration")["value"]
    assert got.to_dict() == pytest.approx(stated.to_dict())  # the pipeline's own per-episode flag
    assert a.query("phase == 'rollout' and rate == 'code_error'")["episodes"].tolist() == [8, 8]  # 4 questions x 2

    ids = [p.task_id for p in load_jsonl(problems)]
    for name, iteration in (("joint-s1.paraphrased.csv", 2), ("base.paraphrased.csv", 0)):
        p = pd.read_csv(out / name)
        assert sorted(p["task_id"]) == sorted(ids) and set(p["iteration"]) == {iteration}
        assert p["success"].isin([0.0, 1.0]).all()
    folders = sorted(f.name for f in (tmp_path / "runs").iterdir() if f.name.startswith("eval-spine-"))
    assert len(folders) == 2

    (out / "joint-s1.paraphrased.csv").unlink()  # written again from the finished folder: no new evaluation
    write_figures(run_dir, out, "joint-s1", problems)
    assert sorted(f.name for f in (tmp_path / "runs").iterdir() if f.name.startswith("eval-spine-")) == folders
    assert pd.read_csv(out / "joint-s1.paraphrased.csv")["iteration"].tolist() == [2, 2, 2]
