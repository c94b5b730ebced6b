"""The evaluate flow: the team at a given policy iteration plays the held-out split greedily; or a team
with agents loaded back from the MLflow model registry (`teamrl eval --model models:/<name>@best`); or a
run's team on a user's own problem file (`teamrl eval RUN --problems FILE`)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from prefect import flow

from flows.metrics import partition_metrics
from infra import runs, store
from infra.engines import require
from infra.errors import UsageError
from infra.policy import OPTIMIZER, checkpoint_dir, latest_version, saved_checkpoint
from infra.registry import resolve
from pipelines.base import role_versions
from tasks import context
from tasks.coach_evaluate import coach_evaluate
from tasks.collect_rollouts import collect_rollouts
from tasks.context import RunContext


def evaluate_partition(run: RunContext, iteration: int) -> dict[str, float]:
    """Play (or reuse) partition iteration=K/phase=eval with the policies after K updates; its metrics."""
    versions = role_versions(run.weights, store.agent_versions(run.run_dir, run.units, iteration))
    collect_rollouts(run, iteration, "eval", versions, split="eval", greedy=True)
    if run.config.rollout.eval_samples:
        collect_rollouts(run, iteration, "eval", versions, split="eval", part="samples")
    coach_evaluate(run, iteration, "eval")
    return partition_metrics(run.run_dir, iteration, "eval")


@flow(name="evaluate", flow_run_name="evaluate-{iteration}")
def evaluate(run_dir: str, iteration: int) -> dict[str, float]:
    """Held-out success (greedy) with a 95% bootstrap interval, pass@k, and per-agent statistics."""
    with RunContext(run_dir) as run:
        require("generation", run.config.engines.generation)
        return evaluate_partition(run, iteration)


def last_iteration(run_dir: str | Path) -> int:
    """The run's latest policy iteration (0: no update yet)."""
    up = store.read_table(run_dir, "updates") if (Path(run_dir) / "updates").is_dir() else None
    return int(up["iteration"].max()) if up is not None and len(up) else 0


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where it can (a checkpoint file is never rewritten in place: a save replaces its whole
    folder), so an evaluation folder costs no space; else a copy."""
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def _new_team(
    runs_dir: str, source: Path, cfg: dict, checkpoints: dict[str, Path | None], extra: dict, run_id: str | None = None
) -> Path:
    """A new run folder (`run_id`, default `eval-<source>-<time>-<hex>`) with the source run's config (its
    identity replaced) and `extra`, and each agent's checkpoint as its version 0 (None: the initial weights),
    weights only: `evaluate(<folder>, 0)` plays that team."""
    new_id = run_id or runs.new_run_id(f"eval-{source.name}")[-100:].lstrip("-._")
    for agent, src in checkpoints.items():
        if src is not None:  # the team only plays: no update reads optimizer state here
            shutil.copytree(
                src,
                checkpoint_dir(Path(runs_dir) / new_id, agent, 0),
                ignore=shutil.ignore_patterns(OPTIMIZER),
                copy_function=_link_or_copy,
            )
    keep = {k: v for k, v in cfg.items() if k not in context.IDENTITY}
    # config.yaml last: a folder a crash left half-copied is no run, so it never plays with missing agents
    return runs.create_run(runs_dir, new_id, keep | {"run": keep["run"] | {"id": new_id}} | extra)


def _problems_config(source: Path, cfg: dict, problems: str | Path, docs: str | Path | None) -> dict:
    """What a folder playing a user's problem file adds to its source run's config: the file, validated by
    the source's pipeline first (so a bad file stops everything before a model loads), and all its problems
    played (no `eval_questions` cut)."""
    RunContext(source).pipeline.load_problems(str(problems), str(docs) if docs else None)
    return {"problems": context.user_problems(problems, docs), "rollout": cfg["rollout"] | {"eval_questions": None}}


def problems_team(
    runs_dir: str,
    source: Path,
    iteration: int,
    problems: str | Path,
    docs: str | Path | None = None,
    run_id: str | None = None,
) -> Path:
    """A new run folder (`run_id`, default `eval-<run>-<time>-<hex>`) in which the team of run `source` at
    policy `iteration` (as version 0) plays a user's problem file as its held-out split:
    `evaluate(<folder>, 0)`. Its config records the file (section `problems`, with its SHA-256) and the
    source (section `source`). Each call makes a new folder; the source run is not modified."""
    if not 0 <= iteration <= (last := last_iteration(source)):
        raise UsageError(f"run {source.name} has policy iterations 0..{last}, not {iteration}")
    cfg = runs.read_run_config(source)
    extra = _problems_config(source, cfg, problems, docs)
    versions = store.agent_versions(source, RunContext(source).units, iteration)
    checkpoints = {a: saved_checkpoint(source, a, v) for a, v in versions.items()}
    return _new_team(
        runs_dir,
        source,
        cfg,
        checkpoints,
        extra | {"source": {"run": str(source), "iteration": iteration, "versions": versions}},
        run_id,
    )


def registered_team(
    runs_dir: str,
    models: list[str],
    tracking_uri: str,
    run_id: str | None = None,
    problems: str | Path | None = None,
    docs: str | Path | None = None,
) -> Path:
    """A new run folder `eval-<run>-<time>-<hex>` for the team of run `run_id` (default: the run that
    registered the first model) with the given registered agents' checkpoints in place of the run's latest
    ones, all as version 0, so `evaluate(<folder>, 0)` plays it: on the run's held-out split, or on a user's
    `problems` file (see `problems_team`). The source run is not modified."""
    with tempfile.TemporaryDirectory() as tmp:
        got: dict[str, tuple] = {}
        for i, uri in enumerate(models):
            local, mv = resolve(uri, tracking_uri, Path(tmp) / str(i))
            agent = mv.tags["teamrl.agent"]
            if agent in got:
                raise UsageError(f"two --model options for agent {agent!r}: {got[agent][2]} and {uri}")
            got[agent] = (local, mv, uri)
        first = next(iter(got.values()))[1]
        source = runs.find_run(runs_dir, run_id) if run_id else Path(first.tags.get("teamrl.run_dir", ""))
        if not (source / "config.yaml").exists():
            raise FileNotFoundError(
                f"the run that registered {models[0]} ({source}) is not here: pass the id of a run "
                "whose team and base model it fits (teamrl eval RUN_ID --model ...)"
            )
        cfg = runs.read_run_config(source)
        agents = RunContext(source).units  # what is registered: the weights units
        for agent, (_, mv, uri) in got.items():
            if agent not in agents:
                raise UsageError(f"{uri} is agent {agent!r}; run {source.name}'s team is {agents}")
            want = (cfg["model"]["name"], cfg["model"]["weights"])
            have = (mv.tags.get("teamrl.model"), mv.tags.get("teamrl.weights"))
            if have != want:
                raise UsageError(
                    f"{uri} was trained on model {have[0]} ({have[1]} weights); run {source.name} uses "
                    f"{want[0]} ({want[1]}): pass a run with the same base model"
                )
        extra = _problems_config(source, cfg, problems, docs) if problems else {}
        checkpoints = {
            a: got[a][0] if a in got else saved_checkpoint(source, a, latest_version(source, a)) for a in agents
        }
        dst = _new_team(runs_dir, source, cfg, checkpoints, extra)
        (dst / "registered.json").write_text(
            json.dumps(
                {
                    "source_run": str(source),
                    **{a: {"uri": u, "name": mv.name, "version": mv.version} for a, (_, mv, u) in got.items()},
                },
                indent=1,
            )
        )
    return dst
