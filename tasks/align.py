"""DAG stage `stage0_align`: TeamTR's Stage-0 alignment for a plug-and-play agent swap.

When agent j is replaced by a new model, the new agent is first trained to minimise the reverse KL
D_KL(pi_new || pi_old_j) on a probe set of the contexts the current team produced at j's turns (the
prompts of j's actions in the latest training rollouts, teacher-forced on the old agent's responses),
until it is <= delta_0; TeamTR then continues from it (docs/concepts/stage0.md).

What a TeamPolicy can hold defines the swaps supported: `init=fresh`, a new agent on the run's own
base model: a freshly initialised LoRA adapter (B = 0, so exactly the base model's behaviour) or, with
`model.weights=full`, a fresh copy of the base. Both are the run's version-0 weights of the agent.
Swapping in another base model or another model size is out of scope today (one TeamPolicy holds one
base).

The math is `tempered_logprobs`, `reverse_kl` and `probe_kl`; the rest moves data and weights.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra import store
from infra.generation import response_logits
from infra.policy import checkpoint_dir
from infra.progress import progress_bar
from tasks.context import RunContext
from tasks.stage import stage

INITS = ("fresh",)


class AlignConfig(BaseModel):
    """One Stage-0 alignment: which agent is swapped for what, and when its alignment stops."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(..., min_length=1, description="the agent that is replaced by a new model")
    init: Literal["fresh"] = Field(
        "fresh",
        description="the new model: `fresh` = a new agent on the run's base "
        "model (a freshly initialised LoRA adapter, or with model.weights=full a fresh "
        "copy of the base), i.e. the base model's behaviour. Another base model or "
        "model size is not supported yet",
    )
    delta0: float = Field(
        0.02,
        gt=0,
        description="stop as soon as the probe-set reverse KL D_KL(pi_new || pi_old) (nats per token) is <= delta0",
    )
    max_steps: int = Field(
        50, ge=0, le=100000, description="at most this many AdamW steps, each on the whole probe set"
    )
    probe_size: int = Field(
        32,
        ge=0,
        description="at most this many of the agent's actions (contexts) in the probe "
        "set, drawn with the run seed (0: all). The old agent's next-token distributions are "
        "held in memory: probe tokens x vocabulary x 4 bytes",
    )
    lr: float | None = Field(None, gt=0, le=1, description="AdamW learning rate (None: the run's algorithm.lr)")
    micro_batch_size: int = Field(
        2,
        ge=1,
        description="actions per forward/backward pass (bounds activation "
        "memory: micro-batch x response tokens x vocabulary logits)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")

    @field_validator("init", mode="before")
    @classmethod
    def _supported_init(cls, v):
        if v not in INITS:
            raise ValueError(
                f"unsupported init {v!r}: only `fresh` (a new agent on the run's base model) is "
                "supported; swapping in another base model or model size is out of scope"
            )
        return v


# -- the math: pure functions of tensors --------------------------------------------------------------
def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p = log_softmax(logits / T) over the last (vocabulary) dim: the sampling distribution of rollouts."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def reverse_kl(new_logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per position D_KL(p_new || p_old) = sum_v p_new(v) * (log p_new(v) - log p_old(v)) (last dim summed)."""
    return (new_logp.exp() * (new_logp - old_logp)).sum(-1)


@dataclass
class Probe:
    """One context of the agent's: the prompt it saw and the old agent's response (teacher-forced)."""

    prompt_ids: list[int]
    response_ids: list[int]


def probe_kl(
    model,
    probe: list[Probe],
    targets: list[torch.Tensor],
    pad_id: int,
    temperature: float,
    micro_batch_size: int,
    backward: bool,
) -> float:
    """KL = sum over probe response positions of reverse_kl(new, old) / number of positions: the token mean
    of D_KL(pi_new || pi_old) over the probe set, `targets[i]` holding the old agent's log-probs [L_i, V].
    With `backward`, the gradient of that mean is accumulated (micro-batch by micro-batch)."""
    total = sum(len(p.response_ids) for p in probe)
    value = 0.0
    for m0 in range(0, len(probe), micro_batch_size):
        micro = probe[m0 : m0 + micro_batch_size]
        with torch.set_grad_enabled(backward):
            logits, _, mask = response_logits(
                model, [p.prompt_ids for p in micro], [p.response_ids for p in micro], pad_id
            )
            new = tempered_logprobs(logits, temperature)
            old = torch.zeros_like(new)  # padded positions are masked out
            for i, t in enumerate(targets[m0 : m0 + len(micro)]):
                old[i, : len(t)] = t
            kl = (reverse_kl(new, old) * mask).sum() / total
        if backward:
            kl.backward()
        value += kl.item()
    return value


@torch.no_grad()
def target_logprobs(
    model, probe: list[Probe], pad_id: int, temperature: float, micro_batch_size: int
) -> list[torch.Tensor]:
    """The old agent's next-token log-probs at each response position of each probe action ([L_i, V] each)."""
    out = []
    for m0 in range(0, len(probe), micro_batch_size):
        micro = probe[m0 : m0 + micro_batch_size]
        logits, _, _ = response_logits(model, [p.prompt_ids for p in micro], [p.response_ids for p in micro], pad_id)
        logp = tempered_logprobs(logits, temperature)
        out += [logp[i, : len(p.response_ids)].clone() for i, p in enumerate(micro)]
    return out


@dataclass
class AlignResult:
    kl_before: float
    kl_after: float
    steps: int
    converged: bool  # kl_after <= delta0
    seconds: float


def align_weights(
    policy,
    agent: str,
    probe: list[Probe],
    targets: list[torch.Tensor],
    *,
    delta0: float,
    max_steps: int,
    lr: float,
    temperature: float,
    micro_batch_size: int = 2,
    max_grad_norm: float = 1.0,
    on_step: Callable[[], None] | None = None,
) -> AlignResult:
    """AdamW on `agent`'s current weights against probe_kl to `targets`. Each step is one pass over the whole
    probe set, whose KL (measured before the step) stops the loop as soon as it is <= delta0; after
    `max_steps` steps one more pass measures the final KL."""
    t0 = time.perf_counter()
    params = policy.parameters(agent)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    pad = policy.tokenizer.pad_token_id
    history: list[float] = []
    with policy.acting(agent) as model:
        for step in range(max_steps + 1):
            opt.zero_grad(set_to_none=True)
            kl = probe_kl(model, probe, targets, pad, temperature, micro_batch_size, backward=step < max_steps)
            history.append(kl)
            if kl <= delta0 or step == max_steps:
                break
            gnorm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            if not (math.isfinite(kl) and math.isfinite(gnorm.item())):
                raise FloatingPointError(f"stage-0 alignment of {agent}: non-finite KL or gradient at step {step}")
            opt.step()
            if on_step:
                on_step()
    return AlignResult(history[0], history[-1], len(history) - 1, history[-1] <= delta0, time.perf_counter() - t0)


# -- the run's data -----------------------------------------------------------------------------------
def latest_rollout_iteration(run_dir: str | Path) -> int | None:
    """The latest iteration whose training rollout partition is complete (None: no rollouts yet)."""
    root = Path(run_dir) / "episodes"
    its = [int(d.name.split("=", 1)[1]) for d in root.glob("iteration=*")] if root.is_dir() else []
    done = [k for k in its if store.partition_exists(run_dir, "episodes", k, "rollout")]
    return max(done) if done else None


def probe_set(run: RunContext, iteration: int, agent: str, size: int) -> list[Probe]:
    """The contexts of `agent`'s actions in iteration `iteration`'s rollouts (with the old agent's responses);
    at most `size` of them (0: all), drawn with a seed derived from the run seed."""
    acts = store.read_table(run.run_dir, "actions", iteration, "rollout")
    acts = acts[acts["agent"] == agent].sort_values(["episode_id", "turn"])
    probe = [Probe(list(p), list(r)) for p, r in zip(acts["prompt_ids"], acts["response_ids"]) if len(r)]
    if size and len(probe) > size:
        rng = random.Random(run.seed_for("probe", iteration, agent))
        probe = [probe[i] for i in sorted(rng.sample(range(len(probe)), size))]
    return probe


def checkpoint_meta(run_dir: str | Path, agent: str, version: int) -> dict:
    return json.loads((checkpoint_dir(run_dir, agent, version) / "meta.json").read_text())


@stage(
    "updates",
    phase="align",
    part=lambda p: p["cfg"].agent,
    returns=lambda out: checkpoint_meta(out.run_dir, out.part, int(out.read("updates")["version_after"].iloc[0])),
    task_run_name="stage0-{cfg.agent}",
)
def stage0_align(run: RunContext, iteration: int, version_before: int, cfg: AlignConfig) -> list[dict]:
    """Align a fresh `cfg.agent` (its version-0 weights) to its version `version_before` on iteration
    `iteration`'s probe set; save the result as version `version_before + 1` (meta `stage0: true`), and
    an `updates` row (phase `align`, strategy `stage0`) so that this version is the agent's version after
    the iteration. A call returns the new checkpoint's meta."""
    agent, run_dir = cfg.agent, run.run_dir
    policy, temperature = run.policy, run.config.rollout.temperature
    lr = cfg.lr or run.config.algorithm.lr
    probe = probe_set(run, iteration, agent, cfg.probe_size)
    pad = policy.tokenizer.pad_token_id
    policy.load(run_dir, agent, version_before)
    with policy.acting(agent) as model:
        targets = target_logprobs(model, probe, pad, temperature, cfg.micro_batch_size)
    policy.load(run_dir, agent, 0)  # the new agent: a fresh adapter / a fresh copy of the base
    policy.changing(agent)
    with progress_bar(f"stage-0 {agent} it={iteration}", cfg.max_steps) as advance:
        res = align_weights(
            policy,
            agent,
            probe,
            targets,
            delta0=cfg.delta0,
            max_steps=cfg.max_steps,
            lr=lr,
            temperature=temperature,
            micro_batch_size=cfg.micro_batch_size,
            max_grad_norm=cfg.max_grad_norm,
            on_step=advance,
        )
    tokens = sum(len(p.response_ids) for p in probe)
    reason = (
        f"stage-0: fresh {agent} aligned to v{version_before:04d}, reverse KL {res.kl_before:.4g} -> "
        f"{res.kl_after:.4g} in {res.steps} steps"
    )
    if not res.converged:
        reason += f"; delta0 {cfg.delta0:g} not reached (raise max_steps or lr)"
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
    meta = {
        "stage0": True,
        "iteration": iteration,
        "init": cfg.init,
        "start_version": 0,
        "aligned_to": version_before,
        "kl_before": res.kl_before,
        "kl_after": res.kl_after,
        "steps": res.steps,
        "converged": res.converged,
        "probe_actions": len(probe),
        "probe_tokens": tokens,
        "lr": lr,
        "seconds": res.seconds,
        "options": cfg.model_dump(mode="json"),
    }
    version_after = version_before + 1
    policy.save(run_dir, agent, version_after, extra=meta)  # no optimiser state: the next PPO update starts afresh
    row = {
        "run_id": run.run_id,
        "iteration": iteration,
        "phase": "align",
        "agent": agent,
        "strategy": "stage0",
        "kl": res.kl_after,
        "surrogate_gain": None,
        "penalty": None,
        "certificate": None,
        "loss": res.kl_after,
        "tokens": tokens * res.steps,
        "seconds": res.seconds,
        "version_before": version_before,
        "version_after": version_after,
        "skipped": False,
        "reason": reason,
        "over_length": None,
        "grad_norm": None,
        "clip_frac": None,
        "kl_ref": None,
    }
    return [row]


@stage("align", phase="align", part=lambda p: p["agent"])
def record_alignment(run: RunContext, iteration: int, agent: str, row: dict) -> list[dict]:
    """The `align` row of a finished Stage-0 alignment of `agent` (its held-out effects included): written
    once, so a repeated `teamrl align` of the same iteration keeps the first record."""
    return [row]
