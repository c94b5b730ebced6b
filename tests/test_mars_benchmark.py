"""benchmarks/mars.py: the per-iteration figures of a real MARS run against its own tables; mars_report.py: the
aggregation over seeds against hand-computed values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import mars, mars_report  # noqa: E402


@pytest.mark.slow
def test_rollout_figures_of_a_tiny_run_match_its_tables(mars_run):
    from infra import store

    _, run_dir = mars_run
    row = mars.per_iteration(Path(run_dir)).set_index("iteration").loc[1]
    eps = store.read_table(run_dir, "episodes")
    eps = eps[eps["phase"] == "rollout"]
    metrics = [dict(m) for m in eps["metrics"]]
    acts = store.read_table(run_dir, "actions")
    s2 = acts[(acts["phase"] == "rollout") & (acts["system"] == 2) & (acts["tool_name"] == "search")]
    queries = [(e, " ".join(str(q).lower().split())) for e, q in zip(s2["episode_id"], s2["tool_input"])]
    ups = store.read_table(run_dir, "updates")

    assert row["train_em"] == pytest.approx(np.mean([m["em"] for m in metrics]))
    assert row["train_f1"] == pytest.approx(np.mean([m["f1"] for m in metrics]))
    assert row["searches_per_episode"] == pytest.approx(np.mean([m["tool_calls"] for m in metrics]))
    assert row["searches_per_episode"] * len(eps) == len(s2)  # every search is a System-2 action
    assert row["repeated_searches_per_episode"] == pytest.approx((len(queries) - len(set(queries))) / len(eps))
    groups = eps.groupby("group_id")["outcome"].agg(lambda x: len(set(x)) > 1)
    assert row["groups_with_signal"] == pytest.approx(groups.mean())
    assert row["s1_compression"] == pytest.approx(
        sum(m["s1_tokens_in"] for m in metrics) / sum(m["s1_tokens_out"] for m in metrics)
    )
    assert row["update_s"] == pytest.approx(ups[ups["iteration"] == 1]["seconds"].sum())
    assert "heldout_em" not in row or np.isnan(row["heldout_em"])  # the fixture does not evaluate


def _questions(em0: list[int], em2: list[int]) -> pd.DataFrame:
    # every question retrieved; found: the first two at iteration 0, all but the last at iteration 2
    ids = [f"q{i}" for i in range(len(em0))]
    rows = [(0, t, "name", 1, e, e, 1, int(i < 2)) for i, (t, e) in enumerate(zip(ids, em0))]
    rows += [(2, t, "name", 1, e, e, 1, int(i < 3)) for i, (t, e) in enumerate(zip(ids, em2))]
    return pd.DataFrame(rows, columns=["iteration", "task_id", "kind", "hops", "em", "f1", "retrieved", "found"])


def test_answer_flags_read_only_what_follows_the_episodes_question():
    examples = "Question: Who founded Jubb Holdings?\nFindings:\n- Jubb Holdings was founded by Ezra Wick.\n"
    question = "Question: Who founded Veltor Press?\n"
    read = "Findings (the founder):\n- Veltor Press was founded by Ada Quill.\nFinal turn: reply with ANSWER."
    names, outputs = ["search", "answer"], ["# Veltor Press\nVeltor Press was founded by Ada Quill.", None]
    # the answer in the findings, any case, as whole words
    assert mars.answer_flags("ada quill", names, outputs, examples + question + read) == {"retrieved": 1, "found": 1}
    # an example's answer is not what this episode read; a longer name containing the answer does not count
    assert mars.answer_flags("Ezra Wick", names, outputs, examples + question + read) == {"retrieved": 0, "found": 0}
    assert mars.answer_flags("Ada Quil", names, outputs, examples + question + read) == {"retrieved": 0, "found": 0}
    # retrieved by the search, but System 1 passed on another sentence
    lost = read.replace("was founded by Ada Quill", "was founded in 1712")
    assert mars.answer_flags("Ada Quill", names, outputs, examples + question + lost) == {"retrieved": 1, "found": 0}
    # the question's own line never counts as read
    assert mars.answer_flags("Veltor Press", ["answer"], [None], examples + question + "ANSWER:")["found"] == 0


def test_report_over_two_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(mars, "OUT", tmp_path)
    # seed 0: 1 of 4 -> 3 of 4 (gain 0.5); seed 1: 2 of 4 -> 2 of 4 (gain 0)
    for seed, (em0, em2) in enumerate([([1, 0, 0, 0], [1, 1, 1, 0]), ([1, 1, 0, 0], [1, 0, 1, 0])]):
        _questions(em0, em2).to_csv(tmp_path / f"shared-s{seed}.questions.csv", index=False)
        pd.DataFrame(
            [
                {"iteration": 0, "heldout_em": np.mean(em0), "heldout_f1": np.mean(em0)},
                {
                    "iteration": 1,
                    "train_f1": 0.1,
                    "groups_with_signal": 0.5,
                    "searches_per_episode": 1.0,
                    "repeated_searches_per_episode": 0.0,
                    "purpose_words": 6.0,
                    "s1_compression": 4.0,
                    "s2_context_tokens": 400.0,
                    "update_s": 100.0 + seed,
                },
                {
                    "iteration": 2,
                    "heldout_em": np.mean(em2),
                    "heldout_f1": np.mean(em2),
                    "train_f1": 0.3,
                    "groups_with_signal": 0.75,
                    "searches_per_episode": 1.0,
                    "repeated_searches_per_episode": 0.0,
                    "purpose_words": 5.0,
                    "s1_compression": 4.0,
                    "s2_context_tokens": 400.0,
                    "update_s": 110.0 + seed,
                },
            ]
        ).to_csv(tmp_path / f"shared-s{seed}.csv", index=False)
    (tmp_path / "runs.jsonl").write_text(
        "".join(json.dumps({"variant": "shared", "seed": s, "wall_s": w}) + "\n" for s, w in [(0, 600), (1, 1200)])
    )
    text = mars_report.report()
    row = next(ln for ln in text.splitlines() if ln.startswith("| shared | 0, 1 |"))
    # held-out EM: iteration 0 (0.25, 0.5), iteration 2 (0.75, 0.5); the gain is the mean of 0.5 and 0
    assert "0: 0.38 ± 0.18, 2: 0.62 ± 0.18" in row
    assert "| +0.25 [" in row
    assert row.endswith("| 15 ± 7 |")  # 10 and 20 minutes
    train = [ln for ln in text.splitlines() if ln.startswith("| shared |")][1]
    assert "0.10 ± 0.00 -> 0.30 ± 0.00" in train and "0.50 ± 0.00 -> 0.75 ± 0.00" in train
    assert train.endswith("| 106 ± 1 |")  # the update's seconds: (100 + 110) / 2 and (101 + 111) / 2
    funnel = next(ln for ln in text.splitlines() if ln.startswith("| shared | 0, 1 | name |"))
    # found 2 of 4 -> 3 of 4 in both seeds; EM when found: seed 0 1/2 -> 3/3, seed 1 2/2 -> 2/3
    assert funnel.endswith(
        "| 1.00 ± 0.00 -> 1.00 ± 0.00 | 0.50 ± 0.00 -> 0.75 ± 0.00 | 0.75 ± 0.35 -> 0.83 ± 0.24 | - -> - |"
    )
    # year replies: only seed 0's file has the column, 3 of 4 name questions answered with a year -> 1 of 4
    q0 = pd.read_csv(tmp_path / "shared-s0.questions.csv")
    q0["year_reply"] = [1, 1, 1, 0] + [1, 0, 0, 0]
    q0.to_csv(tmp_path / "shared-s0.questions.csv", index=False)
    funnel = next(ln for ln in mars_report.report().splitlines() if ln.startswith("| shared | 0, 1 | name |"))
    assert funnel.endswith("| 0.75 (one seed) -> 0.25 (one seed) |")


def test_contrasts_pair_two_variants_question_by_question(monkeypatch):
    monkeypatch.setattr(mars, "CONTRASTS", [("shared", "other"), ("shared", "never-run")])
    qs = {
        "shared": {0: _questions([1, 0, 0, 0], [1, 1, 1, 0]), 1: _questions([1, 1, 0, 0], [1, 0, 1, 0])},
        "other": {0: _questions([0, 0, 0, 0], [1, 0, 0, 0]), 2: _questions([0, 0, 0, 0], [0, 0, 0, 0])},
    }
    lines = mars_report.contrasts(qs)
    # only seed 0 is common: untrained 1 of 4 against 0 of 4, trained 3 of 4 against 1 of 4
    assert [ln for ln in lines if ln.startswith("| shared")] == [
        "| shared − other | 0 | +0.25 [+0.00, +0.75] | +0.50 [+0.00, +1.00] |"
    ]


@pytest.mark.slow
def test_runner_trains_records_and_skips_a_finished_run(tmp_path, monkeypatch, capsys):
    """`benchmarks/mars.py` on deepresearch-tiny: the run's CSVs and summary row are written; with them it is
    skipped; with its per-iteration CSV gone, the ended run is resumed (nothing to train) and recorded again."""
    from argparse import Namespace

    out = tmp_path / "out"
    monkeypatch.setattr(mars, "OUT", out)
    args = Namespace(
        preset="deepresearch-tiny", iterations=1, eval_every=1, runs_dir=str(tmp_path / "runs"), extra=[], note="test"
    )
    mars.run("shared", 3, args)
    per_it = pd.read_csv(out / "shared-s3.csv").set_index("iteration")
    qs = pd.read_csv(out / "shared-s3.questions.csv")
    assert list(per_it.index) == [0, 1] and np.isnan(per_it.loc[0, "train_f1"]) and per_it.loc[1, "update_s"] > 0
    assert sorted(qs["iteration"].unique()) == [0, 1] and len(qs) == 2 * 4  # the preset's 4 held-out questions
    assert per_it.loc[1, "heldout_em"] == pytest.approx(qs[qs["iteration"] == 1]["em"].mean())
    assert set(qs["hops"]) <= {1, 2} and set(qs["kind"]) <= {"year", "name"}
    (row,) = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert row["run_id"] == "mars-shared-s3" and not row["resumed"] and "seed=3" in row["overrides"]

    mars.run("shared", 3, args)
    assert "shared-s3.csv: done, skipped" in capsys.readouterr().out
    (out / "shared-s3.csv").unlink()
    mars.run("shared", 3, args)
    rows = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["resumed"]
    pd.testing.assert_frame_equal(pd.read_csv(out / "shared-s3.csv").set_index("iteration"), per_it)


def test_answer_flags_take_tool_less_turns_as_parquet_reads_them():
    # with three turns, an early answer leaves a turn without a tool: pandas reads its name and output as NA
    names, outputs = [pd.NA, "search"], [pd.NA, "# Veltor Press\nVeltor Press was founded by Ada Quill."]
    assert mars.answer_flags("Ada Quill", names, outputs, "Question: Who founded Veltor Press?\n") == {
        "retrieved": 1,
        "found": 0,
    }
    assert mars.answer_flags("Ada Quill", [pd.NA], [pd.NA], "Question: Who founded Veltor Press?\n")["retrieved"] == 0


def test_by_hops_gives_each_hop_counts_curve_and_skips_one_hop_variants():
    def questions(em1: list[int], em2: list[int]) -> pd.DataFrame:
        rows = [(it, f"q{i}", 1, e) for it, ems in ((0, em1), (2, em2)) for i, e in enumerate(ems)]
        rows += [(it, f"r{i}", 2, 0) for it in (0, 2) for i in range(2)]
        return pd.DataFrame(rows, columns=["iteration", "task_id", "hops", "em"])

    one_hop = questions([1, 0, 0, 0], [1, 1, 0, 0])
    one_hop = one_hop[one_hop["hops"] == 1]
    qs = {
        "mix": {0: questions([1, 0, 0, 0], [1, 1, 0, 0]), 1: questions([1, 1, 0, 0], [1, 1, 1, 1])},
        "one": {0: one_hop},
    }
    table = mars_report.by_hops(qs)
    # 1-hop: seed 0 0.25 -> 0.50, seed 1 0.50 -> 1.00; 2-hop: never answered; the 1-hop-only variant has no row
    assert "| mix | 0, 1 | 1 | 4 | 0: 0.38 ± 0.18, 2: 0.75 ± 0.35 |" in table
    assert "| mix | 0, 1 | 2 | 2 | 0: 0.00 ± 0.00, 2: 0.00 ± 0.00 |" in table
    assert not any(line.startswith("| one ") for line in table)
    assert mars_report.by_hops({"one": {0: one_hop}}) == []
