"""Advantage estimators (REINFORCE++, GRPO, RLOO) as pure functions over per-action samples, chosen
from a registry by name; the `compute_advantages` task wraps them for one iteration's partitions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from infra.plugins import Registry


@dataclass
class Sample:
    """One action of one agent: its sampled-token log-probs and its scalar score s(a) (None = missing);
    reference log-probs are None where no reference pass ran (kl_coef = 0)."""

    episode_id: str
    group_id: str
    agent: str
    turn: int
    logprobs: np.ndarray
    ref_logprobs: np.ndarray | None
    score: float | None


def score_of(s: Sample) -> float:
    """The score of a sample an estimator sees (`estimate` passes only the scored ones)."""
    return cast(float, s.score)


def kl_penalty(logp: np.ndarray, ref_logp: np.ndarray, kind: str = "k1") -> np.ndarray:
    """Per-token KL estimate of pi_theta against pi_ref from sampled-token log-probs."""
    d = logp - ref_logp
    if kind == "k1":
        return d  # k1 = log pi - log pi_ref
    if kind == "k2":
        return 0.5 * d**2  # k2 = (log pi - log pi_ref)^2 / 2
    if kind == "k3":
        return np.exp(-d) - 1 + d  # k3 = exp(log pi_ref - log pi) - 1 - (log pi_ref - log pi)
    raise ValueError(f"unknown KL estimator {kind!r}")


def action_kl(s: Sample, beta: float, kind: str) -> np.ndarray:
    """The KL term of an action's token rewards: zeros when beta = 0 (no reference pass is needed)."""
    if beta == 0:
        return np.zeros(len(s.logprobs))
    if s.ref_logprobs is None:
        raise ValueError(
            f"action {s.episode_id} turn {s.turn} has no reference log-probs: its rollouts were "
            f"collected with algorithm.kl_coef = 0, which skips the reference pass; recollect "
            f"them to train with kl_coef = {beta:g}"
        )
    return kl_penalty(s.logprobs, s.ref_logprobs, kind)


def blend_score(coach: float, outcome: float | None, w: float) -> float:
    """s = (1 - w) * coach / 10 + w * outcome (w = 0, or no outcome: s = coach / 10)."""
    if outcome is None or w == 0:
        return coach / 10.0
    return (1 - w) * coach / 10.0 + w * outcome


def token_rewards(kl: np.ndarray, score: float, beta: float) -> np.ndarray:
    """r_l = -beta * k_l, plus s(a) on the last token."""
    r = -beta * kl.astype(np.float64)
    if len(r):
        r[-1] += score
    return r


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """G_l = sum_{l' >= l} r_l' (undiscounted)."""
    return np.cumsum(rewards[::-1])[::-1].copy()


def whiten(values: list[np.ndarray], eps: float = 1e-6, scale: bool = True, min_std: float = 0.0) -> list[np.ndarray]:
    """(x - mean) / (std + eps) with mean and std over every token of the whole batch (scale=False, or a
    std below `min_std`: x - mean, in the reward's units)."""
    flat = np.concatenate(values) if values else np.zeros(0)
    if flat.size == 0:
        return values
    mean, std = flat.mean(), flat.std()
    # a batch whose returns barely vary (equal scores, only KL noise) is not blown up to unit advantages
    div = std + eps if scale and std >= min_std else 1.0
    return [(v - mean) / div for v in values]


@dataclass(frozen=True)
class EstimatorTraits:
    """What the config and the stages know of an estimator without calling it, declared where it is
    registered (`@register("name", uses_kl=True)`); the defaults are those of `grpo` and `rloo`."""

    # a KL term in the reward (it reads `beta`): without one, algorithm.kl_coef > 0 would only cost a
    # reference pass, so the config refuses it
    uses_kl: bool = False
    # its samples are whole trajectories', across all agents at once, each scored with its episode's reward
    trajectory: bool = False


# algorithm.estimator -> fn(samples, **kwargs) -> one advantage array per sample
ESTIMATORS: Registry[Callable[..., list[np.ndarray]], EstimatorTraits] = Registry("estimator", EstimatorTraits)
register = ESTIMATORS.register


@register("reinforce_pp", uses_kl=True)
def reinforce_pp(
    samples: list[Sample],
    beta: float = 0.01,
    kl_estimator: str = "k1",
    return_scope: str = "action",
    eps: float = 1e-6,
    scale: bool = True,
    min_std: float = 0.0,
) -> list[np.ndarray]:
    """REINFORCE++: KL-shaped token rewards, return-to-go, batch-normalised (no group baseline); a batch
    whose returns' std is below `min_std` is only centred."""
    rewards = [token_rewards(action_kl(s, beta, kl_estimator), score_of(s), beta) for s in samples]
    returns: list[np.ndarray]
    if return_scope == "action":
        returns = [returns_to_go(r) for r in rewards]
    elif return_scope == "agent":
        returns = [np.zeros(0)] * len(samples)
        chains: dict[tuple[str, str], list[int]] = {}
        for i, s in enumerate(samples):
            chains.setdefault((s.episode_id, s.agent), []).append(i)
        for idx in chains.values():
            idx.sort(key=lambda i: samples[i].turn)
            g = returns_to_go(np.concatenate([rewards[i] for i in idx]))
            start = 0
            for i in idx:
                returns[i] = g[start : start + len(rewards[i])]
                start += len(rewards[i])
    else:
        raise ValueError(f"unknown return_scope {return_scope!r}")
    return whiten(returns, eps, scale, min_std)


def _groups(samples: list[Sample]) -> dict[tuple[str, str], list[int]]:
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.group_id, s.agent), []).append(i)
    return groups


@register("grpo")
def grpo(samples: list[Sample], eps: float = 1e-6, scale: bool = True, **_) -> list[np.ndarray]:
    """GRPO: A = (s - mean_group) / (std_group + eps), the same for every token of the action."""
    adv = [np.zeros(len(s.logprobs)) for s in samples]
    for idx in _groups(samples).values():
        scores = np.array([samples[i].score for i in idx], dtype=np.float64)
        a = (scores - scores.mean()) / (scores.std() + eps if scale else 1.0)
        for i, ai in zip(idx, a):
            adv[i] = np.full(len(samples[i].logprobs), ai)
    return adv


@register("grpo_trajectory", trajectory=True)
def grpo_trajectory(samples: list[Sample], eps: float = 1e-6, scale: bool = True, **_) -> list[np.ndarray]:
    """MARS GRPO: A = (R - mean_group(R)) / (std_group(R) + eps) over the group's trajectories (one R
    per episode, whatever its number of samples), shared by every sample of the trajectory. Call it
    with every agent's samples at once (its `trajectory` trait), so no trajectory is left out."""
    reward: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for s in samples:
        if s.episode_id not in reward:
            reward[s.episode_id] = float(score_of(s))
            members.setdefault(s.group_id, []).append(s.episode_id)
    adv: dict[str, float] = {}
    for eps_ids in members.values():
        r = np.array([reward[e] for e in eps_ids])
        adv |= dict(zip(eps_ids, (r - r.mean()) / (r.std() + eps if scale else 1.0)))
    return [np.full(len(s.logprobs), adv[s.episode_id]) for s in samples]


@register("rloo")
def rloo(samples: list[Sample], **_) -> list[np.ndarray]:
    """RLOO: A = s - mean of the other G-1 scores of the group (0 for a group of one)."""
    adv = [np.zeros(len(s.logprobs)) for s in samples]
    for idx in _groups(samples).values():
        scores = np.array([samples[i].score for i in idx], dtype=np.float64)
        n = len(scores)
        a = scores - (scores.sum() - scores) / (n - 1) if n > 1 else np.zeros(n)
        for i, ai in zip(idx, a):
            adv[i] = np.full(len(samples[i].logprobs), ai)
    return adv


def estimate(name: str, samples: list[Sample], **kwargs) -> list[np.ndarray | None]:
    """Run estimator `name` on the samples that have a score; missing scores get no advantage (None).
    `scale=False`: the same advantages before dividing by a standard deviation, in the reward's units."""
    scored = [i for i, s in enumerate(samples) if s.score is not None and np.isfinite(s.score)]
    out: list[np.ndarray | None] = [None] * len(samples)
    for i, a in zip(scored, ESTIMATORS[name]([samples[i] for i in scored], **kwargs)):
        out[i] = a
    return out
