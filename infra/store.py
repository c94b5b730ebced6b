"""The trajectory store: hive-partitioned Parquet tables under `runs/<run_id>/`.

Layout: `<run_dir>/<table>/iteration=K/phase=P/part-<uuid>.parquet`. Every file is written under a
temporary name and renamed into place, so a partition that exists is complete. Read back with pandas:

    from infra.store import load_actions
    df = load_actions("runs/<run_id>")          # actions joined with coach + advantages
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from infra.disk import writing
from infra.errors import TeamrlError
from infra.faults import crash_point

KEYS = ["run_id", "iteration", "phase", "episode_id", "turn", "agent"]

_key_fields = [
    pa.field("run_id", pa.string()),
    pa.field("iteration", pa.int32()),
    pa.field("phase", pa.string()),
    pa.field("episode_id", pa.string()),
    pa.field("turn", pa.int32()),
    pa.field("agent", pa.string()),
]

SCHEMAS: dict[str, pa.Schema] = {
    "episodes": pa.schema(
        [
            pa.field("run_id", pa.string()),
            pa.field("iteration", pa.int32()),
            pa.field("phase", pa.string()),
            pa.field("episode_id", pa.string()),
            pa.field("task_id", pa.string()),
            pa.field("group_id", pa.string()),
            pa.field("pipeline", pa.string()),
            pa.field("success", pa.bool_()),
            pa.field("outcome", pa.float64()),
            pa.field("metrics", pa.map_(pa.string(), pa.float64())),
            pa.field("final_answer", pa.string()),
            pa.field("num_turns", pa.int32()),
            pa.field("policy_versions", pa.map_(pa.string(), pa.int32())),
            pa.field("question", pa.string()),
            pa.field("answer", pa.string()),
            pa.field(
                "infra_error", pa.string()
            ),  # `<kind>: <message>` when an infrastructure fault hit it (infra/retry.py)
        ]
    ),
    "actions": pa.schema(
        _key_fields
        + [
            pa.field("role", pa.string()),
            pa.field("system", pa.int8()),
            pa.field("policy_version", pa.int32()),
            pa.field("prompt_text", pa.string()),
            pa.field("response_text", pa.string()),
            pa.field("prompt_ids", pa.list_(pa.int32())),
            pa.field("response_ids", pa.list_(pa.int32())),
            pa.field("logprobs", pa.list_(pa.float32())),
            pa.field("ref_logprobs", pa.list_(pa.float32())),
            pa.field("tool_name", pa.string()),
            pa.field("tool_input", pa.string()),
            pa.field("tool_output", pa.string()),
            pa.field("parent_turn", pa.int32()),
            pa.field("infra_error", pa.string()),  # the tool never ran: `<kind>: <message>` (infra/retry.py)
        ]
    ),
    "coach": pa.schema(
        _key_fields
        + [
            pa.field("score", pa.float64()),
            pa.field("rationale", pa.string()),
            pa.field("coach_model", pa.string()),
            pa.field("latency_s", pa.float64()),
            pa.field("status", pa.string()),
            pa.field("error_kind", pa.string()),
        ]
    ),
    "advantages": pa.schema(
        _key_fields
        + [
            pa.field("reward", pa.float64()),
            pa.field("advantages", pa.list_(pa.float32())),
            pa.field(
                "raw_advantages", pa.list_(pa.float32())
            ),  # before dividing by a std: reward units (tasks/certificate.py)
            pa.field("loss_mask", pa.list_(pa.int8())),
            pa.field("weight", pa.int32()),
            pa.field("held_out", pa.bool_()),  # kept out of the update for its certificate (tasks/certificate.py)
        ]
    ),
    "updates": pa.schema(
        [
            pa.field("run_id", pa.string()),
            pa.field("iteration", pa.int32()),
            pa.field("phase", pa.string()),
            pa.field("agent", pa.string()),
            pa.field("strategy", pa.string()),
            pa.field("kl", pa.float64()),
            pa.field("surrogate_gain", pa.float64()),
            pa.field("penalty", pa.float64()),
            pa.field("certificate", pa.float64()),
            pa.field("loss", pa.float64()),
            pa.field("tokens", pa.int64()),
            pa.field("seconds", pa.float64()),
            pa.field("version_before", pa.int32()),
            pa.field("version_after", pa.int32()),
            pa.field("skipped", pa.bool_()),
            pa.field("reason", pa.string()),
            pa.field("over_length", pa.int32()),
            pa.field("grad_norm", pa.float64()),
            pa.field("clip_frac", pa.float64()),
            pa.field("kl_ref", pa.float64()),
        ]
    ),
    # one row per Stage-0 alignment (flows/align.py), phase `align` at the iteration whose rollouts probed
    "align": pa.schema(
        [
            pa.field("run_id", pa.string()),
            pa.field("iteration", pa.int32()),
            pa.field("phase", pa.string()),
            pa.field("agent", pa.string()),
            pa.field("init", pa.string()),
            pa.field("version_before", pa.int32()),
            pa.field("version_after", pa.int32()),
            pa.field("probe_actions", pa.int32()),
            pa.field("probe_tokens", pa.int64()),
            pa.field("delta0", pa.float64()),
            pa.field("lr", pa.float64()),
            pa.field("kl_before", pa.float64()),
            pa.field("kl_after", pa.float64()),
            pa.field("steps", pa.int32()),
            pa.field("converged", pa.bool_()),
            pa.field("seconds", pa.float64()),
            pa.field("success_before", pa.float64()),
            pa.field("success_swap", pa.float64()),
            pa.field("success_aligned", pa.float64()),
        ]
    ),
}


class StoreError(TeamrlError, RuntimeError):
    """A table file could not be read; the message names the file."""

    resumable = True


def partition_dir(run_dir: str | Path, table: str, iteration: int, phase: str) -> Path:
    return Path(run_dir) / table / f"iteration={iteration}" / f"phase={phase}"


def partition_exists(run_dir: str | Path, table: str, iteration: int, phase: str, name: str | None = None) -> bool:
    """True when the partition (or, with `name`, that named part of it) has been written completely."""
    d = partition_dir(run_dir, table, iteration, phase)
    if name is not None:
        return (d / f"part-{name}.parquet").exists()
    return d.is_dir() and any(d.glob("part-*.parquet"))


def write_partition(
    run_dir: str | Path, table: str, iteration: int, phase: str, rows: list[dict], name: str | None = None
) -> Path:
    """Write `rows` as one Parquet file of `table`'s partition, atomically (temp name + rename; a failed
    write leaves nothing behind, and a full disk raises infra.disk.DiskFullError).

    `name` makes the file name deterministic (e.g. the agent of an update) so a re-run replaces it
    instead of adding a duplicate; without it a uuid is used.
    """
    schema = SCHEMAS[table]
    missing = [f.name for f in schema if rows and f.name not in rows[0]]
    if missing:
        raise ValueError(f"{table}: rows lack columns {missing}")
    arrays = {f.name: [r.get(f.name) for r in rows] for f in schema}
    t = pa.Table.from_pydict(arrays, schema=schema)
    # Partition columns live in the path (hive), not in the file.
    t = t.drop_columns(["iteration", "phase"])
    d = partition_dir(run_dir, table, iteration, phase)
    final = d / f"part-{name or uuid.uuid4().hex}.parquet"
    tmp = d / f".tmp-{uuid.uuid4().hex}.parquet"
    with writing(final, tmp):
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        crash_point("partition")
        os.replace(tmp, final)
    return d


def read_table(
    run_dir: str | Path,
    table: str,
    iteration: int | None = None,
    phase: str | None = None,
    arrow: bool = False,
    name: str | None = None,
):
    """Read a table (optionally one iteration/phase, and of it the file `name` of `write_partition`) as a
    pandas DataFrame with ArrowDtype columns.

    A corrupt or truncated file raises StoreError naming it; other partitions are unaffected
    (read them with `iteration=`/`phase=` filters).
    """
    root = Path(run_dir) / table
    schema = SCHEMAS[table]
    pattern = (
        f"iteration={iteration if iteration is not None else '*'}/"
        f"phase={phase if phase is not None else '*'}/part-{name if name is not None else '*'}.parquet"
    )
    files = sorted(root.glob(pattern))
    pieces = []
    for f in files:
        try:
            t = pq.read_table(f)
        except Exception as e:  # pyarrow raises several types for damaged files
            raise StoreError(f"cannot read {f}: {e}") from e
        it = int(f.parent.parent.name.split("=", 1)[1])
        ph = f.parent.name.split("=", 1)[1]
        t = t.append_column("iteration", pa.array([it] * len(t), pa.int32()))
        t = t.append_column("phase", pa.array([ph] * len(t), pa.string()))
        for field in schema:  # a column added to the schema after the file was written reads as null
            if field.name not in t.column_names:
                t = t.append_column(field, pa.nulls(len(t), field.type))
        pieces.append(t.select(schema.names).cast(schema))
    t = pa.concat_tables(pieces) if pieces else schema.empty_table()
    if arrow:
        return t
    return t.to_pandas(types_mapper=pd.ArrowDtype)


def load_actions(run_dir: str | Path, iteration: int | None = None, phase: str | None = None) -> pd.DataFrame:
    """Actions joined with their coach scores and advantages on the contract keys."""
    actions = read_table(run_dir, "actions", iteration, phase)
    coach = read_table(run_dir, "coach", iteration, phase)
    adv = read_table(run_dir, "advantages", iteration, phase)
    df = actions.merge(coach, on=KEYS, how="left").merge(adv, on=KEYS, how="left")
    return df.sort_values(["iteration", "phase", "episode_id", "turn"], kind="stable").reset_index(drop=True)


def load_episodes(run_dir: str | Path, iteration: int | None = None, phase: str | None = None) -> pd.DataFrame:
    return read_table(run_dir, "episodes", iteration, phase)


def load_updates(run_dir: str | Path) -> pd.DataFrame:
    return read_table(run_dir, "updates")


def agent_versions(run_dir: str | Path, agents: list[str], through_iteration: int) -> dict[str, int]:
    """Each agent's policy version after iteration `through_iteration` (0 = never updated)."""
    out = {a: 0 for a in agents}
    if through_iteration < 1 or not (Path(run_dir) / "updates").is_dir():
        return out
    up = read_table(run_dir, "updates")
    up = up[up["iteration"] <= through_iteration]
    for a in agents:
        rows = up[up["agent"] == a]
        if len(rows):
            out[a] = int(rows["version_after"].max())
    return out
