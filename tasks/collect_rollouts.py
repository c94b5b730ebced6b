"""DAG stage `collect_rollouts`: the team plays episodes; `actions` and `episodes` partitions."""

from __future__ import annotations

import random
from collections.abc import Sequence

from infra.generation import score_logprobs
from infra.progress import progress_bar
from infra.retry import infra_share_check
from tasks import context
from tasks.acting import TeamActs
from tasks.stage import stage


def check_infra_share(episodes: list, limit: float, where: str) -> None:
    """Stop when the actions of episodes an infrastructure fault hit exceed `limit` of all actions."""
    faulted = [e for e in episodes if e.infra_error]
    infra_share_check(
        sum(len(e.actions) for e in faulted),
        sum(len(e.actions) for e in episodes),
        limit,
        where,
        faulted[0].infra_error if faulted else None,
    )


class ShardPlayer:
    """What a Ray rollout actor plays its shards with: its own context of the run, opened once."""

    def __init__(self, run_dir: str):
        self.ctx = context.RunContext(run_dir)

    def play(self, versions, problems, episode_ids, group_ids, temperature: float, greedy: bool, seed_parts) -> list:
        ctx = self.ctx
        engine = ctx.generation_engine()
        engine.use(ctx.run_dir, versions)
        act = TeamActs(
            engine,
            ctx.policy.tokenizer,
            ctx.pipeline,
            temperature,
            greedy,
            lambda n=1: None,
            lambda agent, n: context.stage_seed(*seed_parts, agent, n),
            in_flow=False,
        )
        return ctx.pipeline.run_episodes(problems, episode_ids, group_ids, act)


def _select(ctx: context.RunContext, iteration: int, phase: str, split: str, n: int | None) -> list:
    probs = ctx.problems(split)
    if split == "eval":
        return probs[:n] if n else probs
    r = random.Random(ctx.seed_for("questions", iteration, phase.split("-")[0]))
    return r.sample(probs, min(n or len(probs), len(probs)))


# a crash in a resample is its own fault point: TeamTR's resume tests kill the run there
@stage(
    "actions",
    "episodes",
    part=lambda p: p["part"],
    fault=lambda p: "resample" if p["phase"].startswith("resample") else "collect_rollouts",
)
def collect_rollouts(
    run: context.RunContext,
    iteration: int,
    phase: str,
    versions: dict[str, int],
    split: str = "train",
    greedy: bool = False,
    part: str = "all",
    questions: int | None = None,
) -> dict[str, list[dict]]:
    """Play the episodes of one partition file: their `actions` and `episodes` rows (the episodes file,
    written last, marks the pair complete).

    part="all": the partition's main episodes (greedy: one per question; else `group_size` per question);
    part="samples": `eval_samples` sampled episodes per question, for pass@k next to the greedy ones.
    `questions` overrides rollout.questions (TeamTR's smaller resamples).
    """
    cfg, engines, pipe, policy = run.config.rollout, run.config.engines, run.pipeline, run.policy
    for agent, v in versions.items():  # the team's model: reference pass, rescoring, the `hf` engine
        policy.load(run.run_dir, agent, v)
    tok = policy.tokenizer
    problems = _select(
        run, iteration, phase, split, cfg.eval_questions if split == "eval" else (questions or cfg.questions)
    )
    sampled = part == "samples"
    if sampled:
        greedy, g, tag = False, cfg.eval_samples, "s"
    else:
        g, tag = (1 if greedy else cfg.group_size), ""
    plist = [p for p in problems for _ in range(g)]
    eids = [f"{phase}-{i // g:04d}-{tag}{i % g:02d}" for i in range(len(plist))]
    gids = [f"{phase}-{i // g:04d}" for i in range(len(plist))]
    if engines.runner == "ray":  # sharded over the rollout actors (infra/engines/ray_rollouts.py)
        seed_parts = (run.config.seed, "sample", iteration, phase, part)
        episodes = run.rollout_workers(ShardPlayer).play(
            gids,
            lambda r, j: (
                (versions, plist[r.start : r.stop], eids[r.start : r.stop], gids[r.start : r.stop])
                + (cfg.temperature, greedy, (*seed_parts, j))
            ),
        )
    else:
        engine = run.generation_engine()
        engine.use(run.run_dir, versions)  # the weight sync: serve every agent's current checkpoint
        with progress_bar(f"rollouts it={iteration} {phase}", len(pipe.agents)) as advance:
            act = TeamActs(
                engine,
                tok,
                pipe,
                cfg.temperature,
                greedy,
                advance,
                lambda agent, n: run.seed_for("sample", iteration, phase, part, agent, n),
            )
            episodes = pipe.run_episodes(plist, eids, gids, act)
    for e in episodes:
        e.metrics["greedy"] = float(greedy)
        e.infra_error = e.infra_error or next((a["infra_error"] for a in e.actions if a["infra_error"]), None)
        e.metrics["infra_error"] = float(e.infra_error is not None)
    check_infra_share(episodes, cfg.max_infra_share, f"iteration {iteration}, {phase} ({part})")

    run_id = run.run_id
    actions = [a | {"episode_id": e.episode_id} for e in episodes for a in e.actions]
    temperature = 1.0 if greedy else cfg.temperature
    # no reference pass (ref_logprobs stay null) for evaluation, which trains nothing, nor without a KL term
    refs: Sequence[list[float] | None] = [None] * len(actions)
    if split != "eval":
        if run.config.algorithm.kl_coef > 0 or run.config.algorithm.kl_loss_coef > 0:
            with policy.reference() as ref:  # one pass for every agent: all share the frozen base
                refs = score_logprobs(
                    ref,
                    [a["prompt_ids"] for a in actions],
                    [a["response_ids"] for a in actions],
                    tok.pad_token_id,
                    batch_size=engines.batch_size,
                    temperature=temperature,
                )
        if engines.rescore_logprobs:
            gaps = rescore(policy, actions, engines.batch_size, temperature)
            for e in episodes:
                if e.episode_id in gaps:
                    e.metrics["logprob_gap"] = gaps[e.episode_id]
    rows = []
    for a, r in zip(actions, refs):
        rows.append(
            a
            | {
                "run_id": run_id,
                "iteration": iteration,
                "phase": phase,
                "ref_logprobs": r,
                "policy_version": versions[a["agent"]],
                "prompt_text": tok.decode(a["prompt_ids"], skip_special_tokens=False),
            }
        )
    ep_rows = [
        {
            "run_id": run_id,
            "iteration": iteration,
            "phase": phase,
            "episode_id": e.episode_id,
            "task_id": e.problem.task_id,
            "group_id": e.group_id,
            "pipeline": pipe.name,
            "success": e.success,
            "outcome": e.outcome,
            "metrics": e.metrics,
            "final_answer": e.final_answer,
            "num_turns": len(e.actions),
            "policy_versions": dict(versions),
            "question": e.problem.question,
            "answer": e.problem.answer,
            "infra_error": e.infra_error,
        }
        for e in episodes
    ]
    return {"actions": rows, "episodes": ep_rows}


def rescore(policy, actions: list[dict], batch_size: int, temperature: float) -> dict[str, float]:
    """Replace each action's `logprobs` (the generation engine's) by the trainer model's, per agent; returns
    the mean absolute gap per token of each episode (what the engines disagree on)."""
    by_agent: dict[str, list[dict]] = {}
    for a in actions:
        by_agent.setdefault(a["agent"], []).append(a)
    gap: dict[str, list[float]] = {}
    for agent, acts in by_agent.items():
        with policy.acting(agent) as model:
            new = score_logprobs(
                model,
                [a["prompt_ids"] for a in acts],
                [a["response_ids"] for a in acts],
                policy.tokenizer.pad_token_id,
                batch_size=batch_size,
                temperature=temperature,
            )
        for a, lp in zip(acts, new):
            gap.setdefault(a["episode_id"], []).extend(abs(x - y) for x, y in zip(a["logprobs"], lp))
            a["logprobs"] = lp
    return {e: float(sum(v) / len(v)) for e, v in gap.items() if v}
