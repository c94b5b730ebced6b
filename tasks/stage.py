"""The DAG stage: a Prefect task whose output is partitions of the store, done once they exist.

    @stage("advantages")
    def compute_advantages(run: RunContext, iteration: int, phase: str) -> list[dict]:
        return advantage_rows(run, iteration, phase)

A stage's function computes its rows; `stage` owns what is the same for every stage:

- skip-if-done: when the partition file of the stage's last table exists, the function is not called, so
  a resume or a retry redoes exactly the stages whose output is missing (the store is the authority);
- the Prefect cache key: (run instance, stage, iteration, phase, part), and only once that file exists,
  so Prefect never serves a result for a partition that was deleted;
- the fault point `crash_point(<stage>)` (infra/faults.py) after the work, before the last table is
  written;
- the atomic partition writes (infra/store.py), tables in the order given: the last one marks the
  stage complete.

Every stage function takes the run's context `run` (tasks/context.py: its folder, config and engines, opened
by the flow) and `iteration`; where its output goes is `phase` (a parameter, unless given) and `part` (the
partition file's name: `all`, or e.g. the updated agent).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import task

from infra import store
from infra.faults import crash_point
from tasks.context import RunContext

Param = str | Callable[[dict], str]  # a constant, or a function of the stage's bound parameters


@dataclass(frozen=True)
class Output:
    """Where a stage call writes: one named file in each table's (iteration, phase) partition."""

    run_dir: str
    iteration: int
    phase: str
    part: str

    def path(self, table: str) -> str:
        return str(store.partition_dir(self.run_dir, table, self.iteration, self.phase))

    def exists(self, table: str) -> bool:
        return store.partition_exists(self.run_dir, table, self.iteration, self.phase, name=self.part)

    def read(self, table: str):
        """The rows this call wrote to `table` (a DataFrame)."""
        return store.read_table(self.run_dir, table, self.iteration, self.phase, name=self.part)


def _value(p: Param, params: dict) -> str:
    return p(params) if callable(p) else p


def stage(
    *tables: str,
    phase: Param = lambda p: p["phase"],
    part: Param = "all",
    fault: Param | None = None,
    returns: Callable[[Output], Any] | None = None,
    **task_options,
):
    """Make `fn` (returning the rows of `tables`: a list for one table, a dict by table for several) a DAG
    stage named after it. `returns` maps the stage's Output to what a call returns (default: the last
    table's partition folder); `fault` names the crash point (default: the stage's name)."""

    def decorate(fn: Callable):
        sig = inspect.signature(fn)
        name = task_options.pop("name", fn.__name__)

        def output(params: dict) -> tuple[Output, dict]:
            bound = sig.bind_partial(**params)
            bound.apply_defaults()
            p = bound.arguments
            run: RunContext = p["run"]
            return Output(run.run_dir, int(p["iteration"]), _value(phase, p), _value(part, p)), p

        def cache_key(_ctx, params: dict) -> str | None:
            out, p = output(params)
            return p["run"].cache_key(out.exists(tables[-1]), name, out.iteration, out.phase, out.part)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            out, p = output(dict(sig.bind(*args, **kwargs).arguments))
            if not out.exists(tables[-1]):
                rows = fn(*args, **kwargs)
                by_table = rows if isinstance(rows, dict) else {tables[0]: rows}
                for table in tables[:-1]:
                    store.write_partition(out.run_dir, table, out.iteration, out.phase, by_table[table], out.part)
                crash_point(_value(fault, p) if fault else name)
                last = tables[-1]
                store.write_partition(out.run_dir, last, out.iteration, out.phase, by_table[last], out.part)
            return returns(out) if returns else out.path(tables[-1])

        return task(name=name, cache_key_fn=cache_key, persist_result=True, **task_options)(run)

    return decorate
