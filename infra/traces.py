"""Episodes as MLflow traces: what the team did, turn by turn, with the coach's verdict on each action, in the
MLflow UI's trace view.

One trace per episode, linked to the run's MLflow run and tagged with the run folder, iteration, phase,
episode and group, so `mlflow.search_traces` filters by them:

- the root span is the episode: the question in, the final answer out, success, outcome, the answer;
- a span per action, in turn order: the agent's prompt (its tail) in, its response out, agent, role,
  system, policy version, response tokens, the mean advantage; a MARS System-1 extraction sits under the
  System-2 call that caused it (`parent_turn`);
- the tool an action called as a child span: the code and what it printed, the search and its documents;
- the coach's score, rationale and status as feedback on the action's span, with the coach as its source.

Traces are written from the stored tables after a stage has finished, never while it runs, so any run,
old ones included, can be traced after the fact. The store records no per-action times: the spans are
ordered, one millisecond apart, from the time the partition was written. A partition traced before
(found by its tags) is not traced again, so a resumed run makes no duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

PROMPT_TAIL = 2000  # characters of an action's prompt kept on its span: its end is what the agent answered


@dataclass
class Span:
    """A span before it is logged: what the UI shows, and the coach's feedback on it."""

    name: str
    span_type: str
    inputs: dict
    outputs: dict
    attributes: dict
    children: list[Span] = field(default_factory=list)
    feedback: dict | None = None  # {score, rationale, status, coach}


def _value(v):
    """A table value as span data: None for a missing one, plain Python for numpy scalars."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return None
    return v.item() if isinstance(v, np.generic) else v


def episode_tree(episode: dict, actions: list[dict]) -> Span:
    """The spans of one stored episode (an `episodes` row) and its actions (`store.load_actions` rows)."""
    root = Span(
        f"episode {episode['episode_id']}",
        "AGENT",
        {"question": episode["question"]},
        {"final_answer": episode["final_answer"]},
        {
            k: _value(episode.get(k))
            for k in ("success", "outcome", "answer", "task_id", "group_id", "pipeline", "infra_error")
        },
    )
    turns: dict[int, Span] = {}
    for a in sorted(actions, key=lambda a: a["turn"]):
        adv = a.get("advantages")
        span = Span(
            f"{a['agent']} (turn {a['turn']})",
            "LLM",
            {"prompt_tail": (a.get("prompt_text") or "")[-PROMPT_TAIL:]},
            {"response": a.get("response_text") or ""},
            {
                "agent": a["agent"],
                "role": a.get("role"),
                "system": _value(a.get("system")),
                "policy_version": _value(a.get("policy_version")),
                "response_tokens": 0 if (ids := a.get("response_ids")) is None else len(ids),
                "advantage": float(np.mean(adv)) if adv is not None and len(adv) else None,
                "reward": _value(a.get("reward")),
            },
        )
        if a.get("tool_name"):
            span.children.append(
                Span(
                    str(a["tool_name"]),
                    "TOOL",
                    {"input": a.get("tool_input") or ""},
                    {"output": a.get("tool_output") or ""},
                    {"infra_error": _value(a.get("infra_error"))},
                )
            )
        if a.get("status") is not None and not pd.isna(a.get("status")):
            span.feedback = {
                "score": _value(a.get("score")),
                "rationale": _value(a.get("rationale")) or "",
                "status": a["status"],
                "coach": _value(a.get("coach_model")) or "coach",
            }
        parent = turns.get(int(a["parent_turn"])) if _value(a.get("parent_turn")) is not None else None
        (parent or root).children.append(span)
        turns[int(a["turn"])] = span
    return root


def sample_episodes(episodes: pd.DataFrame, n: int, seed: int) -> list[str]:
    """`n` episode ids drawn with `seed`, spread over outcomes and groups: successes and failures in turn,
    each time from a group not drawn yet where one is left."""
    rng = np.random.default_rng(seed)
    rows = episodes.iloc[rng.permutation(len(episodes))]
    pools = {ok: rows[rows["success"].astype(bool) == ok] for ok in (False, True)}
    picked: list[str] = []
    groups: set[str] = set()
    turn = False
    while len(picked) < min(n, len(episodes)):
        pool = pools[turn] if len(pools[turn]) else pools[not turn]
        fresh = pool[~pool["group_id"].isin(groups)]
        row = (fresh if len(fresh) else pool).iloc[0]
        picked.append(row["episode_id"])
        groups.add(row["group_id"])
        pools[turn if len(pools[turn]) else not turn] = pool[pool["episode_id"] != row["episode_id"]]
        turn = not turn
    return picked


def _log(span: Span, parent, experiment_id: str, t_ns: int, tags: dict, run_id: str | None, feedback: list) -> tuple:
    """Log `span` and its children (the root opens the trace); (the trace id, the next start time). The
    coach's feedback goes to `feedback` as (trace id, span id, verdict): it can be logged once the trace is."""
    import mlflow

    live = mlflow.start_span_no_context(
        span.name,
        span_type=span.span_type,
        parent_span=parent,
        inputs=span.inputs,
        attributes={k: v for k, v in span.attributes.items() if v is not None},
        tags=tags if parent is None else None,
        metadata={"mlflow.sourceRun": run_id} if parent is None and run_id else None,
        experiment_id=experiment_id if parent is None else None,  # a child's breaks the span (MLflow 3.17)
        start_time_ns=t_ns,
    )
    t_ns += 1_000_000
    for child in span.children:
        _, t_ns = _log(child, live, experiment_id, t_ns, tags, run_id, feedback)
    if span.feedback is not None:
        feedback.append((live.trace_id, live.span_id, span.feedback))
    live.end(outputs=span.outputs, end_time_ns=t_ns)
    return live.trace_id, t_ns + 1_000_000


def _log_feedback(trace_id: str, span_id: str, verdict: dict) -> None:
    import mlflow
    from mlflow.entities import AssessmentSource

    code = verdict["coach"] in ("rubric", "outcome")  # rules, not a model
    mlflow.log_feedback(
        trace_id=trace_id,
        name="coach",
        value=verdict["score"],
        source=AssessmentSource(source_type="CODE" if code else "LLM_JUDGE", source_id=verdict["coach"]),
        rationale=verdict["rationale"],
        metadata={"status": verdict["status"]},
        span_id=span_id,
    )


def trace_ids(tracking_uri: str, experiment_id: str, run_dir: str | Path, iteration: int, phase: str) -> dict:
    """Episode id -> trace id of a partition's episodes that have a trace."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.flush_trace_async_logging()  # what this process logged before is searchable only once written
    found = mlflow.search_traces(
        locations=[experiment_id],
        filter_string=f"tags.`teamrl.run_dir` = '{Path(run_dir).resolve()}' AND tags.`teamrl.iteration` = "
        f"'{iteration}' AND tags.`teamrl.phase` = '{phase}'",
        return_type="list",
        include_spans=False,
    )
    return {t.info.tags.get("teamrl.episode_id"): t.info.trace_id for t in found}


def chosen(run_dir: str | Path, iteration: int, phase: str, mode: str, sample: int, seed: int) -> list[str] | None:
    """The episodes of a partition that `mode` traces (None: all of them): `all` every episode; `sample`
    every held-out episode and `sample` of the iteration's training rollouts (resamples none); `none` none."""
    from infra import store

    if mode == "all" or (mode == "sample" and phase.split("-", 1)[0] == "eval"):
        return None
    if mode == "none" or phase != "rollout":
        return []
    return sample_episodes(store.read_table(run_dir, "episodes", iteration, phase), sample, seed)


def log_partition(
    tracking_uri: str,
    experiment_id: str,
    run_id: str | None,
    run_dir: str | Path,
    iteration: int,
    phase: str,
    episode_ids: list[str] | None = None,
) -> list[str]:
    """A trace for each episode of a stored partition (`episode_ids`: those only) that has none yet; their
    trace ids."""
    import mlflow

    from infra import store

    mlflow.set_tracking_uri(tracking_uri)
    eps = store.read_table(run_dir, "episodes", iteration, phase)
    if episode_ids is not None:
        eps = eps[eps["episode_id"].isin(episode_ids)]
    done = set(trace_ids(tracking_uri, experiment_id, run_dir, iteration, phase))
    eps = eps[~eps["episode_id"].isin(done)]
    if not len(eps):
        return []
    acts = store.load_actions(run_dir, iteration, phase)
    by_episode = {
        e: g.to_dict("records") for e, g in acts[acts["episode_id"].isin(set(eps["episode_id"]))].groupby("episode_id")
    }
    files = list((Path(run_dir) / "episodes" / f"iteration={iteration}" / f"phase={phase}").glob("*.parquet"))
    t_ns = int(max((f.stat().st_mtime for f in files), default=0.0) * 1e9)
    out: list[str] = []
    feedback: list = []
    for ep in eps.sort_values("episode_id").to_dict("records"):
        tags = {
            "teamrl.run_dir": str(Path(run_dir).resolve()),
            "teamrl.iteration": str(iteration),
            "teamrl.phase": phase,
            "teamrl.episode_id": ep["episode_id"],
            "teamrl.group_id": ep["group_id"],
            "teamrl.success": str(bool(ep["success"])).lower(),
        }
        tree = episode_tree(ep, by_episode.get(ep["episode_id"], []))
        trace_id, t_ns = _log(tree, None, experiment_id, t_ns, tags, run_id, feedback)
        out.append(trace_id)
    mlflow.flush_trace_async_logging()
    for trace_id, span_id, verdict in feedback:
        _log_feedback(trace_id, span_id, verdict)
    return out
