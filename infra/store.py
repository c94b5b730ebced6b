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
from infra.schemas import KEYS, SCHEMAS, bare


class StoreError(TeamrlError, RuntimeError):
    """A table file could not be read; the message names the file."""

    resumable = True


class SchemaError(ValueError):
    """Rows do not fit their table's schema (infra/schemas.py), a bug of their writer: the message names the
    table and the keys or the column."""


def partition_dir(run_dir: str | Path, table: str, iteration: int, phase: str) -> Path:
    return Path(run_dir) / table / f"iteration={iteration}" / f"phase={phase}"


def partition_exists(run_dir: str | Path, table: str, iteration: int, phase: str, name: str | None = None) -> bool:
    """True when the partition (or, with `name`, that named part of it) has been written completely."""
    d = partition_dir(run_dir, table, iteration, phase)
    if name is not None:
        return (d / f"part-{name}.parquet").exists()
    return d.is_dir() and any(d.glob("part-*.parquet"))


def _check_keys(table: str, names: list[str], rows: list[dict]) -> None:
    """Refuse rows whose keys are not exactly the table's columns: a missing key would be written as null and
    an unknown one dropped, either without a word."""
    columns = set(names)
    odd = [r for r in rows if r.keys() != columns]
    if not odd:
        return
    missing = [n for n in names if any(n not in r for r in odd)]
    unknown = sorted({k for r in odd for k in r} - columns)
    problems = ([f"rows lack columns {missing}"] if missing else []) + (
        [f"rows have keys {unknown} that are not columns of the table (infra/schemas.py)"] if unknown else []
    )
    raise SchemaError(f"{table}: {'; '.join(problems)}")


def _column(table: str, field: pa.Field, rows: list[dict]) -> pa.Array:
    try:
        return pa.array([r[field.name] for r in rows], type=field.type)
    except pa.ArrowException as e:  # pyarrow names the value and the type, not the column
        raise SchemaError(f"{table}.{field.name}: {e}") from e


def _arrow_rows(table: str, rows: list[dict]) -> pa.Table:
    """`rows` as an Arrow table of `table`'s schema, without the descriptions (see infra.schemas.bare)."""
    schema = bare(SCHEMAS[table])
    _check_keys(table, schema.names, rows)
    return pa.Table.from_arrays([_column(table, f, rows) for f in schema], schema=schema)


def write_partition(
    run_dir: str | Path, table: str, iteration: int, phase: str, rows: list[dict], name: str | None = None
) -> Path:
    """Write `rows` as one Parquet file of `table`'s partition, atomically (temp name + rename; a failed
    write leaves nothing behind, and a full disk raises infra.disk.DiskFullError).

    `name` makes the file name deterministic (e.g. the agent of an update) so a re-run replaces it
    instead of adding a duplicate; without it a uuid is used. Rows that do not fit the table's schema
    raise SchemaError and write nothing.
    """
    t = _arrow_rows(table, rows)
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
