"""Read a run back for people: one flat table of actions, exports to JSONL / CSV, episode transcripts,
the disk space it takes.

    from flows.inspection import episode_table, transcript
    df = episode_table("runs/exp1")          # one row per action, with its episode and coach score
    print(df.groupby(["iteration", "agent"])[["score", "success"]].mean())
    print(transcript("runs/exp1", "rollout-0000-00"))

(The module is not called `inspect`: run as a script, `flows/` would then shadow the standard library's.)
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pandas as pd

from infra import store
from infra.errors import UsageError
from infra.policy import OPTIMIZER

FORMATS = ("jsonl", "csv")
# per-token columns: bulky, and useless to read; `tokens=True` keeps them
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "logprobs", "ref_logprobs", "advantages", "loss_mask")
EPISODE_KEYS = ["run_id", "iteration", "phase", "episode_id"]
_MAPS = ("metrics", "policy_versions")  # map columns of `episodes`, flattened to `metrics.<name>` etc.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def episode_table(
    run_dir: str | Path, tokens: bool = False, iteration: int | None = None, phase: str | None = None
) -> pd.DataFrame:
    """One row per action (optionally of one iteration / phase), keyed by run_id, iteration, phase,
    episode_id, turn, agent: the action, its coach score and rationale, its advantage row's reward and
    weight, and its episode's fields (question, answer, final_answer, outcome, success, ...; the
    `metrics` and `policy_versions` maps as `metrics.<name>` / `policy_versions.<agent>` columns).

    `response_tokens` counts the response's tokens; the per-token lists themselves (ids, log-probs,
    advantages, loss mask) are dropped unless `tokens=True`.
    """
    actions = store.load_actions(run_dir, iteration, phase)
    actions.insert(
        actions.columns.get_loc("response_text") + 1,
        "response_tokens",
        actions["response_ids"].map(len, na_action="ignore").astype("Int64"),
    )
    if not tokens:
        actions = actions.drop(columns=list(TOKEN_COLUMNS))
    episodes = _flatten_maps(store.load_episodes(run_dir, iteration, phase))
    df = actions.merge(episodes, on=EPISODE_KEYS, how="left", validate="many_to_one")
    return df.reset_index(drop=True)


def _flatten_maps(episodes: pd.DataFrame) -> pd.DataFrame:
    """The episodes with each map column spread into one column per key (missing keys: NaN)."""
    parts = [episodes.drop(columns=list(_MAPS))]
    for col in _MAPS:
        wide = pd.DataFrame([dict(m) if isinstance(m, list) else {} for m in episodes[col]], index=episodes.index)
        parts.append(wide.add_prefix(f"{col}."))
    return pd.concat(parts, axis=1)


def default_export_path(run_dir: str | Path, fmt: str) -> Path:
    """Where `teamrl runs export` writes: `<run folder>/export/<run_id>.<fmt>`."""
    return Path(run_dir) / "export" / f"{Path(run_dir).name}.{fmt}"


def export(
    run_dir: str | Path, fmt: str, out: str | Path | None = None, overwrite: bool = False, tokens: bool = False
) -> tuple[Path, int]:
    """Write `episode_table(run_dir, tokens)` to `out` (default: `default_export_path`) as JSONL (one
    JSON object per action) or CSV (list columns JSON-encoded); returns the path and the row count.

    Refuses an existing file unless `overwrite`; the file appears complete or not at all.
    """
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")
    out = Path(out) if out is not None else default_export_path(run_dir, fmt)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (CLI: --overwrite) or another path")
    df = episode_table(run_dir, tokens=tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        if fmt == "jsonl":
            df.to_json(tmp, orient="records", lines=True, force_ascii=False)
        else:
            _json_lists(df).to_csv(tmp, index=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out, len(df)


def _json_lists(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with list columns as JSON strings (CSV cells cannot hold lists)."""
    df = df.copy()
    for col in TOKEN_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda v: json.dumps(v.tolist()), na_action="ignore")
    return df


def transcript(
    run_dir: str | Path,
    episode_id: str,
    iteration: int | None = None,
    phase: str | None = None,
    max_chars: int | None = 1500,
) -> str:
    """One episode as readable markdown-ish text: the question, then each turn's agent, response, tool call
    (input and output) and coach score with rationale, then the final answer, outcome and success.

    Episode ids repeat across iterations (every iteration has `rollout-0000-00`): without `iteration`
    the latest iteration holding the id is shown, and the header names the others. Texts longer than
    `max_chars` are cut (None: never). An unknown id raises ValueError listing ids of this run.
    """
    episodes = store.load_episodes(run_dir)
    same = episodes[episodes["episode_id"] == episode_id]
    found = same
    if iteration is not None:
        found = found[found["iteration"] == iteration]
    if phase is not None:
        found = found[found["phase"] == phase]
    if not len(found):
        raise UsageError(_unknown_episode(run_dir, episodes, episode_id, iteration, phase))
    it = int(found["iteration"].max())
    chosen = found[found["iteration"] == it]
    if len(chosen) > 1:
        phases = ", ".join(sorted(chosen["phase"]))
        raise UsageError(
            f"episode {episode_id!r} is in several phases of iteration {it} ({phases}); pass phase= (CLI: --phase)"
        )
    ep = chosen.iloc[0]
    others = sorted({int(i) for i in same["iteration"]} - {it})
    acts = store.load_actions(run_dir, it, str(ep["phase"]))
    acts = acts[acts["episode_id"] == episode_id].sort_values("turn")
    lines = _header(ep, others) + [f"## Question\n\n{_clip(ep['question'], max_chars)}", ""]
    for a in acts.to_dict("records"):
        lines += _turn(a, max_chars)
    lines += [
        "## Result",
        "",
        f"final answer:    {_clip(ep['final_answer'], max_chars) or '(none)'}",
        f"expected answer: {_text(ep['answer']) or '(unknown)'}",
        f"outcome: {_num(ep['outcome'])}   success: {'yes' if ep['success'] else 'no'}",
    ]
    return "\n".join(lines) + "\n"


def _unknown_episode(run_dir, episodes: pd.DataFrame, episode_id: str, iteration, phase) -> str:
    """Why no episode matched, with ids that would (the id's own partitions when it exists elsewhere)."""
    where = "".join(f", {k} {v}" for k, v in (("iteration", iteration), ("phase", phase)) if v is not None)
    same = episodes[episodes["episode_id"] == episode_id]
    if len(same):
        at = ", ".join(f"iteration {i} phase {p}" for i, p in sorted(zip(same["iteration"], same["phase"])))
        return f"no episode {episode_id!r}{where} in {run_dir}; it is at {at}"
    subset = episodes
    if iteration is not None:
        subset = subset[subset["iteration"] == iteration]
    if phase is not None:
        subset = subset[subset["phase"] == phase]
    ids = list(dict.fromkeys((subset if len(subset) else episodes)["episode_id"]))
    if not ids:
        return f"no episode {episode_id!r} in {run_dir}: the run has no episodes yet"
    known = ", ".join(ids[:5]) + (f", ... ({len(ids)} ids in all)" if len(ids) > 5 else "")
    return f"no episode {episode_id!r}{where} in {run_dir}; ids in this run{where}: {known}"


def _header(ep: pd.Series, other_iterations: list[int]) -> list[str]:
    lines = [
        f"# Episode {ep['episode_id']}: run {ep['run_id']}, iteration {ep['iteration']}, phase {ep['phase']}",
        "",
        f"pipeline {ep['pipeline']}, task {ep['task_id']}, group {ep['group_id']}, {ep['num_turns']} turns",
    ]
    if other_iterations:
        lines.append(
            f"(the id also occurs at iteration {', '.join(map(str, other_iterations))}; "
            "choose with iteration= / --iteration)"
        )
    return lines + [""]


def _turn(a: dict, max_chars: int | None) -> list[str]:
    """The lines of one action: heading, response, tool call, coach verdict."""
    role = _text(a["role"])
    who = a["agent"] if role in ("", a["agent"]) else f"{a['agent']} ({role})"
    extra = f", System {a['system']}" if _text(a["system"]) not in ("", "0") else ""
    if _text(a["parent_turn"]):
        extra += f", for turn {a['parent_turn']}"
    lines = [
        f"## Turn {a['turn']}: {who} (policy v{a['policy_version']}{extra})",
        "",
        _clip(a["response_text"], max_chars) or "(empty response)",
        "",
    ]
    if _text(a["tool_name"]) or _text(a["tool_input"]) or _text(a["tool_output"]):
        lines += [
            f"tool {_text(a['tool_name']) or '?'}",
            f"  input:  {_indent(_clip(a['tool_input'], max_chars), 10) or '(none)'}",
            f"  output: {_indent(_clip(a['tool_output'], max_chars), 10) or '(none)'}",
            "",
        ]
    status, model = _text(a.get("status")), _text(a.get("coach_model"))
    verdict = f"coach score {_num(a.get('score'))}" + (f" ({model})" if model else "")
    if status not in ("", "ok"):
        verdict += f", status {status}"
    rationale = _indent(_clip(a.get("rationale"), max_chars), 2)
    return lines + [verdict + (f": {rationale}" if rationale else ""), ""]


def _text(v) -> str:
    """A cell as text without control characters; null -> ''."""
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    return _CONTROL.sub("", str(v)).strip()


def _clip(v, max_chars: int | None) -> str:
    s = _text(v)
    if max_chars is None or len(s) <= max_chars:
        return s
    return f"{s[:max_chars]} ... [{len(s) - max_chars} more characters]"


def _indent(s: str, width: int) -> str:
    """Continuation lines indented by `width` spaces."""
    return s.replace("\n", "\n" + " " * width)


def _num(v) -> str:
    return "-" if v is None or pd.isna(v) else f"{float(v):g}"


DISK_KINDS = ("checkpoints", "optimizer state", "tables", "other")


def disk_use(run_dir: str | Path) -> dict[str, int]:
    """Bytes of a run folder's files by kind, and their `total`: `checkpoints` (the weights and their metadata),
    `optimizer state` (the AdamW moments kept with checkpoints), `tables` (the trajectory store) and `other`
    (config, plots, summaries, exports)."""
    root = Path(run_dir)
    use = dict.fromkeys(DISK_KINDS, 0)
    for dirpath, _, files in os.walk(root):
        top = Path(dirpath).relative_to(root).parts[:1]
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            if top == ("checkpoints",):
                kind = "optimizer state" if f == OPTIMIZER else "checkpoints"
            else:
                kind = "tables" if top and top[0] in store.SCHEMAS else "other"
            use[kind] += p.stat().st_size
    return use | {"total": sum(use.values())}


def mlflow_artifacts(run_dir: str | Path) -> Path | None:
    """The folder of the run's MLflow artifacts when they are in the default place next to the runs,
    `<runs>/mlartifacts/<MLflow run id>` (training copies its checkpoints there at the end)."""
    id_file = Path(run_dir) / "mlflow_run_id"
    if not id_file.exists():
        return None
    d = Path(run_dir).parent / "mlartifacts" / id_file.read_text().strip()
    return d if d.is_dir() else None


def size_text(n: int) -> str:
    """Bytes for people: `512 B`, `3.4 KiB`, `12.0 MiB`, `1.1 GiB`."""
    if n < 1024:
        return f"{n} B"
    size, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while size >= 1024 and len(units) > 1:
        size, units = size / 1024, units[1:]
    return f"{size:.1f} {units[0]}"


def disk_summary(run_dir: str | Path) -> str:
    """One line: the run folder's disk use by kind, and its MLflow artifacts' when they are local."""
    use = disk_use(run_dir)
    parts = ", ".join(f"{k} {size_text(use[k])}" for k in DISK_KINDS)
    line = f"disk use: {size_text(use['total'])} in {run_dir} ({parts})"
    if art := mlflow_artifacts(run_dir):
        line += f"; MLflow artifacts {size_text(disk_use(art)['total'])} in {art}"
    return line


def _mlflow_of(run_dir: str | Path, runs_dir: str | Path) -> tuple[str, str, str]:
    """(tracking URI, experiment id, MLflow run id) of a run that logged to MLflow."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from infra.errors import UsageError
    from infra.runs import read_run_config
    from infra.tracking import default_tracking_uri

    id_file = Path(run_dir) / "mlflow_run_id"
    if not id_file.exists():
        raise UsageError(f"run {Path(run_dir).name} logged nothing to MLflow (run.mlflow was false)")
    uri = read_run_config(run_dir)["run"].get("tracking_uri") or default_tracking_uri(runs_dir)
    run_id = id_file.read_text().strip()
    try:
        return uri, MlflowClient(uri).get_run(run_id).info.experiment_id, run_id
    except MlflowException:
        raise UsageError(
            f"run {Path(run_dir).name}'s MLflow run {run_id} is not in {uri} (the run folder was copied or "
            "moved without its MLflow database): pass --dir with the folder that holds it"
        ) from None


def traces(run_dir: str | Path, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """The run's episodes traced in MLflow (`mlflow.search_traces`'s DataFrame: one row per trace, with its
    spans, tags and the coach's feedback as assessments); `runs_dir` holds the default MLflow database."""
    import mlflow

    uri, experiment, run_id = _mlflow_of(run_dir, runs_dir or Path(run_dir).parent)
    mlflow.set_tracking_uri(uri)
    return mlflow.search_traces(locations=[experiment], run_id=run_id)


def trace_run(
    run_dir: str | Path, runs_dir: str | Path, iteration: int | None = None, every: bool = False
) -> dict[tuple[int, str], int]:
    """Trace a stored run's partitions after the fact (those of `iteration` only, if given): what the run's
    `run.traces` chooses, or every episode with `every`; per (iteration, phase), the traces written (an
    episode traced before is not traced again)."""
    from infra.runs import read_run_config
    from infra.traces import chosen, log_partition
    from tasks.context import stage_seed

    uri, experiment, run_id = _mlflow_of(run_dir, runs_dir)
    cfg = read_run_config(run_dir)
    mode = "all" if every else cfg["run"].get("traces", "sample")
    out = {}
    for it_dir in sorted((Path(run_dir) / "episodes").glob("iteration=*")):
        k = int(it_dir.name.split("=", 1)[1])
        if iteration is not None and k != iteration:
            continue
        for phase in sorted(p.name.split("=", 1)[1] for p in it_dir.glob("phase=*")):
            seed = stage_seed(cfg["seed"], "traces", k)
            episodes = chosen(run_dir, k, phase, mode, cfg["run"].get("trace_sample", 8), seed)
            if episodes != []:
                out[(k, phase)] = len(log_partition(uri, experiment, run_id, run_dir, k, phase, episodes))
    return out


def trace_link(run_dir: str | Path, runs_dir: str | Path, episode: str, iteration: int, phase: str) -> str | None:
    """The MLflow UI's page of an episode's trace, if it has one."""
    import os

    from infra.traces import trace_ids

    uri, experiment, _ = _mlflow_of(run_dir, runs_dir)
    found = trace_ids(uri, experiment, run_dir, iteration, phase).get(episode)
    ui = os.environ.get("TEAMRL_MLFLOW_UI", "http://127.0.0.1:5000").rstrip("/")
    return f"{ui}/#/experiments/{experiment}/traces?selectedEvaluationId={found}" if found else None
