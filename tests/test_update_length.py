"""`algorithm.max_sample_tokens`: an update leaves out the samples longer than the bound, counts them in
`updates.over_length` and trains on the rest; a batch with nothing left is skipped and says why."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from conftest import redo_update

from infra import store
from infra.trainer import TrainItem
from tasks.update import ALL_OVER_LENGTH, within_length


def _item(prompt: int, response: int) -> TrainItem:
    return TrainItem([1] * prompt, [2] * response, [0.0] * response, [0.0] * response, [1] * response)


def test_within_length_keeps_prompt_plus_response_up_to_the_bound():
    items = [_item(10, 5), _item(10, 6), _item(3, 3), _item(20, 1)]
    kept, over = within_length(items, 15)  # lengths 15, 16, 6, 21
    assert kept == [items[0], items[2]] and over == 2
    assert within_length(items, None) == (items, 0)
    assert within_length([], 15) == ([], 0)


@pytest.mark.slow
def test_an_update_leaves_out_and_counts_the_samples_over_the_bound(trained_run, tmp_path):
    """On a copy of the tiny run, iteration 1's executor and solver updates are redone with a bound at the
    executor's median sample length, then with one below every solver sample."""
    _, src = trained_run
    run_dir = str(tmp_path / "copy")
    shutil.copytree(src, run_dir)
    acts = store.load_actions(run_dir, 1, "rollout")
    acts = acts[acts["weight"].fillna(0) > 0]
    length = {
        a: sorted(len(p) + len(r) for p, r in zip(g["prompt_ids"], g["response_ids"])) for a, g in acts.groupby("agent")
    }
    bound = length["executor"][len(length["executor"]) // 2]
    assert length["executor"][0] <= bound < length["executor"][-1], "the executor's samples must differ in length"

    def redo(agent: str, max_tokens: int) -> dict:
        return redo_update(run_dir, 1, agent, max_sample_tokens=max_tokens)

    over = sum(n > bound for n in length["executor"])
    row = redo("executor", bound)
    mine = acts[acts["agent"] == "executor"]
    kept_tokens = sum(
        sum(m)
        for p, r, m in zip(mine["prompt_ids"], mine["response_ids"], mine["loss_mask"])
        if len(p) + len(r) <= bound
    )
    assert row["over_length"] == over and not row["skipped"] and row["version_after"] == 1
    assert row["tokens"] == kept_tokens  # one epoch over the kept samples
    assert f"{over} sample(s) longer than algorithm.max_sample_tokens={bound}" in row["warnings"]

    row = redo("solver", length["solver"][0] - 1)
    assert row["over_length"] == len(length["solver"]) and row["skipped"] and row["reason"] == ALL_OVER_LENGTH
    assert row["version_after"] == 0 and row["tokens"] == 0


@pytest.mark.slow
def test_a_one_question_batch_gets_no_certificate_and_says_why(teamtr_run, tmp_path):
    """When the held-out episodes are one question's group, the bound's estimation term (clustered by
    question) is infinite, so the row holds no certificate and its reason says why. Shown on a copy of the
    TeamTR run whose stage-start episodes are relabelled as one group."""
    import pyarrow.parquet as pq

    from tasks.update import FEW_HELD_OUT

    _, src = teamtr_run
    run_dir = str(tmp_path / "copy")
    shutil.copytree(src, run_dir)
    ups = store.read_table(run_dir, "updates", 1, "rollout")
    (agent,) = ups["agent"]  # TeamTR's first agent of the stage updates on the stage-start rollouts
    assert ups["certificate"].notna().all()  # as run: two of four questions held out, a finite certificate
    for f in store.partition_dir(run_dir, "episodes", 1, "rollout").glob("*.parquet"):
        t = pq.read_table(f)
        i = t.schema.get_field_index("group_id")
        pq.write_table(t.set_column(i, t.schema.field(i), [["one"] * len(t)]), f)
    row = redo_update(run_dir, 1, agent)
    assert pd.isna(row["certificate"])
    assert f"no certificate: {FEW_HELD_OUT}" in row["reason"] and row["surrogate_gain"] is not None
