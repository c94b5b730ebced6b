"""DAG stage `update`: one PPO-clip gradient update of one weights unit (an agent's own weights, or the
model MARS's two systems share) on the samples of every role it plays; a checkpoint and an `updates` row.

The gradient steps run in the configured trainer (`engines.trainer`: torch, or DeepSpeed ZeRO), on
the same loss function (tasks/losses.py).

With a trust region (`algorithm.kl_delta`) the epochs stop early when a minibatch's KL estimate
exceeds delta, then the step is halved (backtracking) until the whole batch's KL is within delta;
after every update the row records the token KL on the batch and the surrogate gain in reward units,
and, for the one-by-one strategies (`stale`, `teamtr`), the penalty and the certificate: a lower bound on
the update's true improvement of the team's return (tasks/certificate.py).
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from functools import partial

import numpy as np
import pandas as pd
import torch

from infra import store
from infra.faults import crash_point
from infra.policy import OPTIMIZER, checkpoint_dir
from infra.progress import progress_bar
from infra.ranks import ray_ranks, spawn_ranks
from infra.trainer import TrainItem, TrainSpec, batch_logprobs, interpolate
from tasks.advantages import ESTIMATORS, token_rewards
from tasks.certificate import Bound, Segment, bound, episode_terms, return_span, reward_range, team_advantages
from tasks.context import RunContext
from tasks.losses import LOSSES, with_reference_kl
from tasks.stage import stage
from tasks.trust_region import kl_tok

NO_SCORED_ACTIONS = "no scored actions for this agent"  # the reason of an update that had nothing to train on
ALL_OVER_LENGTH = "every sample longer than algorithm.max_sample_tokens"
NOT_MEASURED = "an action longer than algorithm.max_sample_tokens, or none scored"
# certificate.cluster_se: the spread between one question's episodes says nothing of the next question's
FEW_HELD_OUT = "fewer than two question groups held out of the update (algorithm.certify_holdout)"
# the trainer's statistics an `updates` row keeps: means over the update's optimizer steps
TRAIN_STATS = ("grad_norm", "clip_frac", "kl_ref")


def within_length(items: list[TrainItem], max_tokens: int | None) -> tuple[list[TrainItem], int]:
    """The items of at most `max_tokens` prompt + response tokens (None: all), and how many were longer."""
    if max_tokens is None:
        return items, 0
    kept = [it for it in items if len(it.prompt_ids) + len(it.response_ids) <= max_tokens]
    return kept, len(items) - len(kept)


def batch_of(ctx: RunContext, iteration: int, phase: str, unit: str) -> tuple[list[TrainItem], int]:
    """Weights unit `unit`'s update batch, and the number of its samples left out for their length."""
    df = store.load_actions(ctx.run_dir, iteration, phase)
    items = ctx.pipeline.train_items(df[df["agent"].isin(ctx.roles_of(unit))], ctx.config.algorithm.kl_loss_coef > 0)
    return within_length(items, ctx.config.algorithm.max_sample_tokens)


def enforce_trust_region(
    policy,
    agent: str,
    items: list[TrainItem],
    start: list,
    delta: float,
    steps: int,
    temperature: float,
    micro_batch_size: int,
) -> tuple[float, float]:
    """Backtrack from the trained weights towards `start` until KL <= delta; (KL, step fraction kept), the
    fraction 0 (weights back at `start`) when `steps` halvings were not enough."""
    params = policy.parameters(agent)
    with policy.materialized(agent, modify=True):  # whole even where the trainer partitions them (ZeRO-3)
        end = [p.detach().clone() for p in params]
        alpha = 1.0
        for _ in range(steps + 1):
            new, old, _, mask = batch_logprobs(policy, agent, items, temperature, micro_batch_size)
            kl = kl_tok(new, old, mask)
            if kl <= delta:
                return kl, alpha
            alpha /= 2
            interpolate(params, start, end, alpha)
        interpolate(params, start, end, 0.0)
    return kl, 0.0


def _ratios(policy, agent: str, rows: list[dict], temperature: float, micro_batch_size: int) -> list[np.ndarray]:
    """pi_now / pi_batch of each row's response tokens under the agent's loaded weights."""
    items = [
        TrainItem(
            list(r["prompt_ids"]),
            list(r["response_ids"]),
            list(r["logprobs"]),
            [0.0] * len(r["response_ids"]),
            [1] * len(r["response_ids"]),
        )
        for r in rows
    ]
    if not items:
        return []
    new, old, _, _ = batch_logprobs(policy, agent, items, temperature, micro_batch_size)
    out = []
    for i, r in enumerate(rows):
        n = len(r["response_ids"])
        out.append(np.exp((new[i, :n] - old[i, :n]).double().numpy()))
    return out


def updated_before(run_dir: str, iteration: int, phase: str, agent: str) -> dict[str, int]:
    """Weights units updated on this batch before `agent` (`stale`: every earlier one), with their new versions."""
    done = store.read_table(run_dir, "updates", iteration, phase)
    return {
        r["agent"]: int(r["version_after"]) for r in done.to_dict("records") if r["agent"] != agent and not r["skipped"]
    }


def episode_rewards(df, trajectory: bool) -> dict[str, list[np.ndarray]]:
    """Each episode's task rewards per action in turn order, token by token: the action's reward
    (`advantages.reward`; unscored: 0) on its last token, no KL shaping; a trajectory reward is the
    episode's, counted once, on its last action."""
    out: dict[str, list[np.ndarray]] = {}
    for e, g in df.sort_values("turn").groupby("episode_id", sort=False):
        records = g.to_dict("records")
        scores = [float(r["reward"]) if r["reward"] is not None and not pd.isna(r["reward"]) else 0.0 for r in records]
        if trajectory:
            scores = [0.0] * (len(scores) - 1) + scores[-1:]
        out[str(e)] = [token_rewards(np.zeros(len(r["response_ids"])), score, 0.0) for r, score in zip(records, scores)]
    return out


def measure_update(
    ctx: RunContext,
    iteration: int,
    phase: str,
    agent: str,
    changed: dict[str, int] | None,
    temperature: float,
    micro_batch_size: int,
) -> tuple[float | None, Bound | None, str]:
    """After an update of weights unit `agent`: the token KL on the actions it trained on, and the bound of
    tasks/certificate.py on the task return (`changed`: the units updated since the batch was sampled, at
    their new versions; None for a joint update, which gets the surrogate gain on the whole batch and no
    certificate). A sequential update's bound is estimated on the held-out groups only. (KL, None, why)
    where no bound can be computed: no scored action, an action of the unit or of `changed` longer than
    algorithm.max_sample_tokens (its forward pass could exhaust memory, and the bound needs every token's
    ratio), no held-out group, or rewards outside the pipeline's declared bounds; a bound with fewer than
    two groups has an infinite estimation term."""
    cfg, policy, run_dir = ctx.config.algorithm, ctx.policy, ctx.run_dir
    df = store.load_actions(run_dir, iteration, phase)
    df = df.assign(unit=df["agent"].map(ctx.weights), scored=df["reward"].notna(), held=df["held_out"].fillna(False))
    mine = df[df["unit"] == agent].to_dict("records")
    if not any(r["scored"] for r in mine):
        return None, None, NOT_MEASURED
    certify = [r for r in mine if r["held"]] if changed is not None else mine
    episodes = {r["episode_id"] for r in certify}
    others = [r for r in df[df["unit"].isin(list(changed or {}))].to_dict("records") if r["episode_id"] in episodes]
    if cfg.max_sample_tokens is not None and any(
        len(r["prompt_ids"]) + len(r["response_ids"]) > cfg.max_sample_tokens for r in mine + others
    ):
        return None, None, NOT_MEASURED
    ratios = dict(zip(map(id, mine), _ratios(policy, agent, mine, temperature, micro_batch_size)))
    for other, version in (changed or {}).items():
        policy.load(run_dir, other, version)
        rows = [r for r in others if r["unit"] == other]
        ratios |= dict(zip(map(id, rows), _ratios(policy, other, rows, temperature, micro_batch_size)))
    rho = np.concatenate([ratios[id(r)] for r in mine if not r["held"]] or [np.ones(0)])
    kl = float(np.mean(rho - 1 - np.log(rho))) if len(rho) else 0.0  # the k3 token mean, as the trust region's
    if not episodes:
        return kl, None, FEW_HELD_OUT
    trajectory = ESTIMATORS.traits(cfg.estimator).trajectory
    team = df[df["episode_id"].isin(episodes)]
    group = store.read_table(run_dir, "episodes", iteration, phase).set_index("episode_id")["group_id"]
    rewards = episode_rewards(team, trajectory)
    pipe = ctx.pipeline
    limits = reward_range(pipe.outcome_range, cfg.outcome_weight, trajectory)
    span = return_span(pipe.max_actions(), limits, trajectory)
    # what the certificate's span rests on; a joint update's gain needs none of it
    if changed is not None and (why := outside_bounds(rewards, pipe.max_actions(), limits)) is not None:
        return kl, None, why
    turns = {e: sorted(int(t) for t in g["turn"]) for e, g in team.groupby("episode_id")}
    adv = team_advantages(rewards, turns, {e: str(group[e]) for e in rewards})
    adv_of = {(e, t): a for e in adv for t, a in zip(turns[e], adv[e])}
    segments: dict[str, list[Segment]] = {}
    for r in sorted(certify + others, key=lambda r: (r["episode_id"], r["turn"])):
        a = adv_of[(r["episode_id"], int(r["turn"]))] if r["unit"] == agent else None
        segments.setdefault(r["episode_id"], []).append(Segment(r["unit"], ratios[id(r)], a))
    x, y = map(np.array, zip(*[episode_terms(segs, agent, set(changed or {})) for segs in segments.values()]))
    return kl, bound(x, y, [str(group[e]) for e in segments], span), ""


def outside_bounds(rewards: dict[str, list[np.ndarray]], max_actions: int, limits: tuple[float, float]) -> str | None:
    """Why the batch breaks the bounds the certificate's span rests on (tasks/certificate.py), or None."""
    if (most := max(map(len, rewards.values()), default=0)) > max_actions:
        return f"an episode with {most} actions, more than the pipeline's max_actions() = {max_actions}"
    per = np.concatenate([np.concatenate(rs) for rs in rewards.values() if rs] or [np.zeros(0)])
    if per.size and (per.min() < limits[0] - 1e-9 or per.max() > limits[1] + 1e-9):
        return f"a reward outside the pipeline's declared range [{limits[0]:g}, {limits[1]:g}]"
    return None


@stage(
    "updates",
    part=lambda p: p["agent"],
    returns=lambda out: int(out.read("updates")["version_after"].iloc[0]),
    task_run_name="update-{agent}",
)
def update(run: RunContext, iteration: int, phase: str, agent: str, version_before: int) -> list[dict]:
    """Update weights unit `agent` from `version_before` (a call returns the version after)."""
    cfg, policy, run_dir = run.config.algorithm, run.policy, run.run_dir
    policy.load(run_dir, agent, version_before)
    items, over_length = batch_of(run, iteration, phase, agent)
    if over_length:
        warnings.warn(
            f"{agent} iteration {iteration}: {over_length} sample(s) longer than algorithm.max_sample_tokens="
            f"{cfg.max_sample_tokens} left out of the update",
            RuntimeWarning,
            stacklevel=2,
        )
    row = {
        "run_id": run.run_id,
        "iteration": iteration,
        "phase": phase,
        "agent": agent,
        "strategy": cfg.strategy,
        "penalty": None,
        "certificate": None,
        "version_before": version_before,
        "over_length": over_length,
    } | dict.fromkeys(TRAIN_STATS)
    if not items:
        row |= {
            "kl": None,
            "surrogate_gain": None,
            "loss": None,
            "tokens": 0,
            "seconds": 0.0,
            "version_after": version_before,
            "skipped": True,
            "reason": ALL_OVER_LENGTH if over_length else NO_SCORED_ACTIONS,
        }
    else:
        temperature = run.config.rollout.temperature
        with policy.materialized(agent):
            start = [p.detach().clone() for p in policy.parameters(agent)]
        steps = cfg.epochs * -(-len(items) // cfg.minibatch_size)
        trainer = run.trainer()
        run.release_generation()  # colocated on one GPU: the generation engine sleeps while we train
        policy.changing(agent)
        world = run.config.engines.train_ranks
        # with several ranks, this process is rank 0 and keeps the result: the rest of the update is as for one
        with (
            progress_bar(f"update {agent} it={iteration}", steps) as advance,
            _ranks(run, (run_dir, iteration, phase, agent, version_before)),
        ):
            res, opt_state = trainer.train(
                policy,
                agent,
                items,
                loss_of(run),
                spec_of(run, iteration, phase, agent, version_before, on_step=advance, world=world),
            )
        row |= {
            "kl": None,
            "surrogate_gain": None,
            "loss": None if math.isnan(res.loss) else res.loss,
            "tokens": res.tokens,
            "seconds": res.seconds,
            "skipped": res.skipped,
            "reason": res.reason,
        } | {k: res.stats.get(k) for k in TRAIN_STATS}
        if not res.skipped and cfg.kl_delta is not None:
            kl, kept = enforce_trust_region(
                policy, agent, items, start, cfg.kl_delta, cfg.backtrack_steps, temperature, cfg.micro_batch_size
            )
            row |= {"kl": kl, "reason": f"step x{kept:g}" if kept < 1 else ""}
            if kept == 0.0:
                row |= {
                    "skipped": True,
                    "reason": f"trust region: KL {kl:.4g} > delta {cfg.kl_delta:g} after "
                    f"{cfg.backtrack_steps} halvings; weights restored",
                }
        if not row["skipped"] and cfg.measure_update:
            sequential = cfg.strategy != "joint"  # a joint step moves every agent at once: no per-agent bound
            changed = updated_before(run_dir, iteration, phase, agent) if sequential else None
            measured, b, why = measure_update(run, iteration, phase, agent, changed, temperature, cfg.micro_batch_size)
            cert = b.certificate if sequential and b is not None and math.isfinite(b.certificate) else None
            if sequential and cert is None:  # an infinite estimation term: fewer than two groups to estimate it
                infinite = b is not None and math.isinf(b.penalty_est)
                why = why or (FEW_HELD_OUT if infinite else "its bound is not finite")
                row["reason"] = "; ".join(filter(None, [str(row["reason"] or ""), "no certificate: " + why]))
            row |= {
                "kl": row["kl"] if row["kl"] is not None else measured,  # with a trust region: the KL it held
                "surrogate_gain": b.gain if b is not None else None,
                "penalty": b.penalty if b is not None and cert is not None else None,
                "certificate": cert,
            }
        if row["skipped"]:
            warnings.warn(f"{agent} iteration {iteration}: {row['reason']}", RuntimeWarning, stacklevel=2)
            row["version_after"] = version_before
        else:
            row["version_after"] = version_before + 1
            policy.save(
                run_dir,
                agent,
                version_before + 1,
                optimizer_state=opt_state,
                extra={"iteration": iteration, "phase": phase},
            )
    return [row]


def loss_of(ctx: RunContext):
    cfg = ctx.config.algorithm
    base = partial(LOSSES[cfg.loss], clip_eps=cfg.clip_eps)
    return partial(with_reference_kl, base=base, beta=cfg.kl_loss_coef) if cfg.kl_loss_coef > 0 else base


def spec_of(ctx: RunContext, iteration: int, phase: str, agent: str, version_before: int, **more) -> TrainSpec:
    """How the update of `agent` from `version_before` trains; every training rank builds the same one."""
    cfg = ctx.config.algorithm
    return TrainSpec(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        epochs=cfg.epochs,
        minibatch_size=cfg.minibatch_size,
        max_grad_norm=cfg.max_grad_norm,
        micro_batch_size=cfg.micro_batch_size,
        kl_stop=cfg.kl_delta,
        seed=ctx.seed_for("update", iteration, phase, agent),
        optimizer_state=checkpoint_dir(ctx.run_dir, agent, version_before) / OPTIMIZER,
        temperature=ctx.config.rollout.temperature,
        skip_zero_advantage=LOSSES.traits(cfg.loss).advantage_weighted and cfg.kl_loss_coef == 0,
        **more,
    )


def _ranks(ctx: RunContext, update_args: tuple):
    """With `engines.train_ranks` > 1, the other ranks (infra/ranks.py) for the update in the body, run as
    rank 0; else nothing."""
    e = ctx.config.engines
    if e.train_ranks == 1:
        return nullcontext()
    threads = max(1, (e.threads or torch.get_num_threads()) // e.train_ranks)
    if e.train_launcher == "ray":
        return ray_ranks(e.train_ranks, threads, train_rank, update_args, e.ray)
    return spawn_ranks(e.train_ranks, threads, train_rank, update_args)


def train_rank(
    run_dir: str, iteration: int, phase: str, agent: str, version_before: int, rank: int, world: int
) -> None:
    """Training rank `rank` > 0 of an update: the same batch and spec as rank 0, its share of each minibatch
    (infra/trainer.py `accumulate`), on a replica of the agent's adapter or a shard of its full weights
    (infra/sharded.py); rank 0 keeps the result."""
    with RunContext(run_dir) as ctx:
        ctx.policy.load(run_dir, agent, version_before)
        ctx.policy.changing(agent)  # rank 0 saves the result; here the weights become no version's
        items, _ = batch_of(ctx, iteration, phase, agent)
        # the fault point after each of this rank's steps: tests kill a rank in the middle of an update
        spec = spec_of(
            ctx,
            iteration,
            phase,
            agent,
            version_before,
            rank=rank,
            world=world,
            on_step=lambda: crash_point(f"rank{rank}"),
        )
        ctx.trainer().train(ctx.policy, agent, items, loss_of(ctx), spec)
