"""The trajectory store (infra/store.py): hive layout, explicit Arrow types, atomic writes, joins, errors."""

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra import schemas, store

KEY = dict(run_id="r1", episode_id="e0", turn=0, agent="solver")

# One row per table; floats are exact in float32 so the round trip can compare with ==.
ROWS = {
    "episodes": dict(
        run_id="r1",
        episode_id="e0",
        task_id="t0",
        group_id="g0",
        pipeline="mathchat",
        success=True,
        outcome=1.0,
        metrics={"code_error": 0.0},
        final_answer="5",
        num_turns=3,
        policy_versions={"solver": 2},
        question="2+3?",
        answer="5",
        infra_error=None,
    ),
    "actions": dict(
        KEY,
        role="solver",
        system=1,
        policy_version=2,
        prompt_text="p",
        response_text="r",
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        logprobs=[-0.5, -0.25],
        ref_logprobs=[-0.75, -1.0],
        tool_name="python",
        tool_input="print(5)",
        tool_output="5",
        parent_turn=None,
        infra_error=None,
    ),
    "coach": dict(KEY, score=7.0, rationale="ok", coach_model="rubric", latency_s=0.5, status="ok", error_kind=None),
    "advantages": dict(
        KEY,
        reward=0.7,
        advantages=[0.5, -1.5],
        raw_advantages=[0.25, -0.75],
        loss_mask=[1, 0],
        weight=1,
        held_out=False,
    ),
    "updates": dict(
        run_id="r1",
        agent="solver",
        strategy="joint",
        kl=0.01,
        surrogate_gain=0.1,
        penalty=0.0,
        certificate=0.0,
        loss=-0.1,
        tokens=12,
        seconds=1.5,
        version_before=0,
        version_after=1,
        skipped=False,
        reason="",
        over_length=0,
        grad_norm=0.3,
        clip_frac=0.05,
        kl_ref=0.002,
    ),
    "align": dict(
        run_id="r1",
        agent="executor",
        init="fresh",
        version_before=2,
        version_after=3,
        probe_actions=8,
        probe_tokens=192,
        delta0=0.02,
        lr=0.0005,
        kl_before=0.25,
        kl_after=0.015625,
        steps=2,
        converged=True,
        seconds=1.5,
        success_before=0.5,
        success_swap=0.25,
        success_aligned=0.5,
    ),
}

EXPLICIT_TYPES = [
    ("actions", "prompt_ids", pa.list_(pa.int32())),
    ("actions", "response_ids", pa.list_(pa.int32())),
    ("actions", "logprobs", pa.list_(pa.float32())),
    ("actions", "ref_logprobs", pa.list_(pa.float32())),
    ("actions", "system", pa.int8()),
    ("episodes", "metrics", pa.map_(pa.string(), pa.float64())),
    ("episodes", "policy_versions", pa.map_(pa.string(), pa.int32())),
    ("advantages", "advantages", pa.list_(pa.float32())),
    ("advantages", "loss_mask", pa.list_(pa.int8())),
    ("coach", "score", pa.float64()),
]


def write(run_dir, table, iteration=1, phase="rollout", rows=None, name=None, **changes):
    rows = rows if rows is not None else [dict(ROWS[table], **changes)]
    return store.write_partition(
        run_dir, table, iteration, phase, [dict(r, iteration=iteration, phase=phase) for r in rows], name=name
    )


def test_every_table_has_a_sample_row():
    assert set(ROWS) == set(store.SCHEMAS)


@pytest.mark.parametrize("table", sorted(store.SCHEMAS))
def test_round_trip_and_hive_layout(tmp_path, table):
    d = write(tmp_path, table, iteration=3, phase="resample-1")
    assert d == tmp_path / table / "iteration=3" / "phase=resample-1"
    files = list(d.iterdir())
    assert len(files) == 1 and files[0].name.startswith("part-") and files[0].suffix == ".parquet"
    assert not list(tmp_path.rglob(".tmp-*"))
    # partition columns live in the path, not in the file
    assert not {"iteration", "phase"} & set(pq.read_schema(files[0]).names)

    t = store.read_table(tmp_path, table, arrow=True)
    assert t.schema.equals(store.SCHEMAS[table])
    got = t.to_pylist()[0]
    expected = dict(ROWS[table], iteration=3, phase="resample-1")
    for col in ("metrics", "policy_versions"):  # Arrow maps come back as (key, value) pairs
        if col in expected:
            expected[col] = list(expected[col].items())
    assert got == expected

    df = store.read_table(tmp_path, table)
    assert all(isinstance(dt, pd.ArrowDtype) for dt in df.dtypes)


@pytest.mark.parametrize("table, column, arrow_type", EXPLICIT_TYPES)
def test_explicit_arrow_types(tmp_path, table, column, arrow_type):
    write(tmp_path, table)
    assert store.read_table(tmp_path, table, arrow=True).schema.field(column).type == arrow_type
    assert store.read_table(tmp_path, table)[column].dtype == pd.ArrowDtype(arrow_type)


def test_every_table_and_column_has_a_description():
    for table, schema in store.SCHEMAS.items():
        assert schemas.description(schema), table
        assert not [f.name for f in schema if not schemas.description(f)], table


def test_write_rejects_rows_missing_a_column(tmp_path):
    row = dict(ROWS["coach"], iteration=1, phase="rollout")
    del row["status"]
    with pytest.raises(store.SchemaError, match=r"coach: rows lack columns \['status'\]"):
        write(tmp_path, "coach", rows=[ROWS["coach"], row])  # any row, not only the first
    assert not list(tmp_path.rglob("*.parquet"))


def test_write_rejects_keys_the_schema_lacks(tmp_path):
    with pytest.raises(store.SchemaError, match=r"coach: rows have keys \['scroe'\]"):
        write(tmp_path, "coach", rows=[ROWS["coach"], dict(ROWS["coach"], scroe=1.0)])
    assert not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("column, value", [("score", "high"), ("turn", "0"), ("response_ids", [1.5, "x"])])
def test_write_rejects_a_value_of_the_wrong_type_naming_the_column(tmp_path, column, value):
    table = "actions" if column == "response_ids" else "coach"
    with pytest.raises(store.SchemaError, match=rf"{table}\.{column}: "):
        write(tmp_path, table, **{column: value})
    assert not list(tmp_path.rglob("*.parquet"))


def test_written_files_carry_no_descriptions(tmp_path):
    d = write(tmp_path, "coach")
    assert pq.read_schema(next(d.glob("part-*.parquet"))).field("score").metadata is None
    assert schemas.description(store.read_table(tmp_path, "coach", arrow=True).schema.field("score"))


def test_a_column_added_later_reads_as_null_in_older_files(tmp_path):
    write(tmp_path, "coach", name="new", error_kind="timeout")
    old = pa.schema(
        [f for f in schemas.bare(store.SCHEMAS["coach"]) if f.name not in ("error_kind", "iteration", "phase")]
    )
    row = {k: v for k, v in ROWS["coach"].items() if k != "error_kind"} | {"episode_id": "e1"}
    d = store.partition_dir(tmp_path, "coach", 1, "rollout")
    pq.write_table(pa.Table.from_pylist([row], schema=old), d / "part-old.parquet")  # written before the column
    df = store.read_table(tmp_path, "coach").sort_values("episode_id")
    assert df["error_kind"].isna().tolist() == [False, True] and df["error_kind"].iloc[0] == "timeout"
    assert df["error_kind"].dtype == pd.ArrowDtype(pa.string()) and df["status"].tolist() == ["ok", "ok"]


def test_named_part_replaces_and_unnamed_parts_accumulate(tmp_path):
    write(tmp_path, "updates", name="solver", loss=1.0)
    write(tmp_path, "updates", name="solver", loss=2.0)
    assert store.partition_exists(tmp_path, "updates", 1, "rollout", name="solver")
    assert list(store.read_table(tmp_path, "updates")["loss"]) == [2.0]
    assert [p.name for p in (tmp_path / "updates").rglob("*.parquet")] == ["part-solver.parquet"]

    write(tmp_path, "coach")
    write(tmp_path, "coach")
    assert len(store.read_table(tmp_path, "coach")) == 2


def test_read_filters_and_empty_table(tmp_path):
    write(tmp_path, "coach", iteration=1, score=1.0)
    write(tmp_path, "coach", iteration=10, score=10.0)
    write(tmp_path, "coach", iteration=1, phase="eval", score=3.0)
    assert list(store.read_table(tmp_path, "coach", iteration=1, phase="rollout")["score"]) == [1.0]
    assert sorted(store.read_table(tmp_path, "coach", iteration=1)["score"]) == [1.0, 3.0]  # not iteration=10
    assert sorted(store.read_table(tmp_path, "coach", phase="rollout")["score"]) == [1.0, 10.0]
    empty = store.read_table(tmp_path, "advantages")
    assert len(empty) == 0 and list(empty.columns) == store.SCHEMAS["advantages"].names


def test_load_actions_joins_on_keys(tmp_path):
    for phase, score in (("rollout", 7.0), ("eval", 2.0)):  # the same keys in another phase must not mix
        write(tmp_path, "actions", phase=phase, rows=[ROWS["actions"], dict(ROWS["actions"], turn=1, agent="executor")])
        write(
            tmp_path,
            "coach",
            phase=phase,
            rows=[dict(ROWS["coach"], score=score), dict(ROWS["coach"], turn=1, agent="executor", score=score + 1)],
        )
    write(tmp_path, "advantages")  # only rollout / turn 0 has advantages

    df = store.load_actions(tmp_path, phase="rollout")
    assert list(df["turn"]) == [0, 1] and list(df["agent"]) == ["solver", "executor"]
    assert list(df["score"]) == [7.0, 8.0]
    assert list(df["advantages"][0]) == [0.5, -1.5] and pd.isna(df["advantages"][1])
    assert all(isinstance(dt, pd.ArrowDtype) for dt in df.dtypes)
    assert {"response_ids", "status", "loss_mask", "weight"} <= set(df.columns)

    both = store.load_actions(tmp_path)
    assert len(both) == 4  # no cross product between phases
    assert sorted(both[both["phase"] == "eval"]["score"]) == [2.0, 3.0]


def test_agent_versions(tmp_path):
    agents = ["solver", "executor", "verifier"]
    assert store.agent_versions(tmp_path, agents, 3) == dict.fromkeys(agents, 0)  # no updates table yet
    write(tmp_path, "updates", iteration=1, name="solver", agent="solver", version_after=1)
    write(tmp_path, "updates", iteration=1, name="executor", agent="executor", version_after=1)
    write(tmp_path, "updates", iteration=2, name="solver", agent="solver", version_after=2)
    assert store.agent_versions(tmp_path, agents, 0) == dict.fromkeys(agents, 0)
    assert store.agent_versions(tmp_path, agents, 1) == {"solver": 1, "executor": 1, "verifier": 0}
    assert store.agent_versions(tmp_path, agents, 5) == {"solver": 2, "executor": 1, "verifier": 0}


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_file_names_itself_and_other_partitions_still_read(tmp_path, damage):
    write(tmp_path, "actions", iteration=1)
    bad = next(write(tmp_path, "actions", iteration=2).glob("part-*.parquet"))
    data = bad.read_bytes()
    bad.write_bytes(b"not a parquet file" if damage == "garbage" else data[: len(data) // 2])

    with pytest.raises(store.StoreError) as e:
        store.read_table(tmp_path, "actions")
    assert str(bad) in str(e.value)
    with pytest.raises(store.StoreError):
        store.load_actions(tmp_path)
    assert len(store.read_table(tmp_path, "actions", iteration=1)) == 1


def test_runs_compared_across_processes_agree_in_floats_to_rounding_and_in_the_rest_exactly(tmp_path):
    """conftest `assert_same_table`, which the resume tests use: a last-bit difference in a log-prob passes;
    a difference an update could make, other text, another list length or a missing cell fails."""
    from conftest import assert_same_table

    def run(name, **change):
        write(tmp_path / name, "actions", rows=[dict(ROWS["actions"], **change)])
        return tmp_path / name

    ref = run("ref")
    assert_same_table(ref, run("ulp", logprobs=[-0.5 + 6e-8, -0.25]), "actions")
    for name, change in {
        "update": dict(logprobs=[-0.5 + 1e-4, -0.25]),
        "text": dict(response_text="s"),
        "length": dict(logprobs=[-0.5, -0.25, -1.0]),
        "missing": dict(logprobs=None),
    }.items():
        with pytest.raises(AssertionError):
            assert_same_table(ref, run(name, **change), "actions")
