"""DAG stage `coach_evaluate`: a score 0..10 for every action of every agent; the `coach` partition."""

from __future__ import annotations

import time
from pathlib import Path

from infra import store
from infra.retry import InfraFault, infra_kind, infra_record, infra_share_check, with_retries
from pipelines.base import Episode, Problem
from tasks.coach import CoachConfig, CoachRequest, CoachResult, LLMCoach
from tasks.context import RunContext
from tasks.stage import stage


def load_partition_episodes(run_dir: str, iteration: int, phase: str) -> list[Episode]:
    """Rebuild the pipeline's Episode objects from the stored `episodes` and `actions` tables."""
    eps = store.read_table(run_dir, "episodes", iteration, phase).to_dict("records")
    acts = store.read_table(run_dir, "actions", iteration, phase).sort_values(["episode_id", "turn"])
    by_ep: dict[str, list[dict]] = {}
    for a in acts.to_dict("records"):
        by_ep.setdefault(a["episode_id"], []).append(a)
    out = []
    for e in sorted(eps, key=lambda e: e["episode_id"]):
        out.append(
            Episode(
                problem=Problem(e["task_id"], e["question"], e["answer"]),
                episode_id=e["episode_id"],
                group_id=e["group_id"],
                actions=by_ep.get(e["episode_id"], []),
                final_answer=e["final_answer"],
                success=bool(e["success"]),
                outcome=float(e["outcome"]),
                metrics=dict(e["metrics"] or {}),
                infra_error=e["infra_error"],
            )
        )
    return out


def unscored(e: Episode, record: str) -> list[CoachResult]:
    """Every action of an episode an infrastructure fault hit: no score, so no gradient."""
    kind = infra_kind(record)
    return [
        CoachResult(None, f"not scored: infrastructure fault ({record})", "error", 0.0, error_kind=f"infra_{kind}")
        for _ in e.actions
    ]


def score_episodes(run: RunContext, episodes: list[Episode]) -> list[list[CoachResult]]:
    """Each episode's scores; an episode an infrastructure fault hit is never scored, whatever the backend."""
    clean = [e for e in episodes if not e.infra_error]
    scored = dict(zip((e.episode_id for e in clean), score_clean(run, run.config.coach, clean)))
    return [unscored(e, e.infra_error) if e.infra_error else scored[e.episode_id] for e in episodes]


def score_clean(run: RunContext, cfg: CoachConfig, episodes: list[Episode]) -> list[list[CoachResult]]:
    """Each episode's scores under the coach `cfg` (episodes no infrastructure fault hit)."""
    pipe = run.pipeline
    if cfg.backend == "outcome":  # MAPPA's outcome-only baseline: the shared sparse team reward
        return [[CoachResult(10.0 * e.outcome, "episode outcome", "ok", 0.0) for _ in e.actions] for e in episodes]
    if cfg.backend == "rubric":
        out = []
        for e in episodes:
            t0 = time.perf_counter()
            try:
                scores = with_retries(
                    lambda: pipe.rubric(e, cfg.ground_truth),  # noqa: B023 (called within this iteration)
                    "scorer",
                    f"the rubric on {e.episode_id}",
                )
            except InfraFault as fault:
                out.append(unscored(e, infra_record(fault.kind, fault.message)))
                continue
            dt = (time.perf_counter() - t0) / max(1, len(scores))
            out.append([CoachResult(s, why, "ok" if s is not None else "skipped", dt) for s, why in scores])
        return out
    coach = LLMCoach(cfg, cache_path=Path(run.run_dir).parent / "coach-cache.sqlite")
    flat = coach.score_many(coach_requests(pipe, episodes, cfg.ground_truth))
    out, i = [], 0
    for e in episodes:
        out.append(flat[i : i + len(e.actions)])
        i += len(e.actions)
    return out


def coach_requests(pipe, episodes: list[Episode], ground_truth: bool) -> list[CoachRequest]:
    """The `llm` coach's request for every action of `episodes`, in order."""
    roles = {a.name: a.role for a in pipe.agents}
    return [
        CoachRequest(e.problem.question, roles[a["agent"]], a["prompt_text"], a["response_text"], f)
        for e in episodes
        for a, f in zip(e.actions, pipe.feedback(e, ground_truth))
    ]


@stage("coach", retries=2, retry_delay_seconds=5)
def coach_evaluate(run: RunContext, iteration: int, phase: str) -> list[dict]:
    """Score every action of the partition."""
    cfg = run.config.coach
    episodes = load_partition_episodes(run.run_dir, iteration, phase)
    results = score_episodes(run, episodes)
    faults = [r.rationale for rs in results for r in rs if str(r.error_kind).startswith("infra_")]
    infra_share_check(
        len(faults),
        sum(map(len, results)),
        run.config.rollout.max_infra_share,
        f"iteration {iteration}, {phase} (coach)",
        faults[0] if faults else None,
    )
    model = cfg.model if cfg.backend == "llm" else cfg.backend
    run_id = run.run_id
    return [
        {
            "run_id": run_id,
            "iteration": iteration,
            "phase": phase,
            "episode_id": e.episode_id,
            "turn": int(a["turn"]),
            "agent": a["agent"],
            "score": r.score,
            "rationale": r.rationale,
            "coach_model": model,
            "latency_s": r.latency_s,
            "status": r.status,
            "error_kind": r.error_kind,
        }
        for e, rs in zip(episodes, results)
        for a, r in zip(e.actions, rs)
    ]
