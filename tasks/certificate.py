"""TeamTR's improvement certificate: a lower bound on what one agent's update does to the team's return,
estimated from the update's own batch, in the units of the reward.

Setting. A team takes turns on one shared context; an episode's return is the sum of every agent's
rewards, as training builds them (an action's blended score on its last token, a trajectory reward once
on the episode's last action, minus beta times each token's KL to the reference), and J(pi) is its
expectation under the team pi. Agent i's update turns the team pi^{i-1} into pi^i. The batch was
sampled by the team pi^b: pi^b = pi^{i-1} when it was resampled just before the update (`teamtr`), the
stage-start team when it was cached (`stale`), in which case the agents C updated since then differ.
Every token t the agents in C + {i} wrote in the batch has a ratio rho_t = pi_now(a_t|s_t) / pi^b(a_t|s_t)
(pi_now: the updated weights; 1 for every other agent's token).

Bound. The performance-difference lemma, taken from the old team's side, is exact:
    J(pi^i) - J(pi^{i-1}) = sum_h E_{pi^{i-1}}[(rho_h - 1) A^{pi^i}_h]        (h: agent i's tokens)
It has the old team's occupancy but the new team's advantage A^{pi^i}. Two steps take it to what the
batch can estimate, the surrogate L = sum_h E_b[(rho_h - 1) A_h] with the batch's own advantages A:
  1. A^{pi^i} - A^{pi^b} at (s_h, a_h) is a difference of expected returns from the same point. Couple the
     two continuations token by token (the new token equals the old one with probability min(1, rho_t)):
     they differ only after a token of C + {i} diverged, so |Q^{pi^i} - Q^{pi^b}| <= span * E[sum_{t > h}
     (1 - rho_t)_+], with span the range of returns.
  2. The occupancy of pi^{i-1} is the batch's reweighted by W_h = prod_{t < h, t in C} rho_t, and
     |W_h - 1| <= sum_{t < h, t in C} W_t |rho_t - 1| (telescoping); with |A^{pi^i}| <= span.
So, per episode of the batch,
    X = sum_{h in I_i} (rho_h - 1) A_h                                                  (surrogate gain)
    Y = sum_{h in I_i} |rho_h - 1| (sum_{t in I_{C+i}, t > h} (1 - rho_t)_+ + sum_{t in I_C, t < h} W_t |rho_t - 1|)
and  J(pi^i) - J(pi^{i-1}) >= E_b[X] - span * E_b[Y]  exactly. Y is second order in the step (a product
of two ratio deviations), so small steps certify; it grows with the acting agent's tokens per episode and
the tokens of C + {i} after them, and the stale term (Theorem 3.7's stale occupancy) with every agent
already updated since the batch was sampled. For `teamtr`, C is empty and only the first sum remains.

Estimate. certificate = mean(X - span * Y) - z * se: a one-sided lower confidence bound (z = 1.645: 95%),
se the standard error of the mean with episodes clustered by group (a group's episodes share a question
and a baseline). Assumptions: groups are independent draws, their number is large enough for the normal
approximation, A is an unbiased advantage of the team's return (`team_advantages`: the team's
return-to-go from the stored rewards and log-probs, minus a baseline from the group's other episodes;
not the estimator's per-agent advantages, which leave out what an action does to later agents'
rewards), and returns lie within `span` (each action's reward in [0, 1], so the most scored actions of an
episode, one for a trajectory reward; widened to the batch's observed range where the KL shaping makes
it wider). The batch is the one the
update was fitted to, so the gain is optimistic by however much the update fitted its noise; the bound
does not correct for that (benchmarks/certificate_check.py measures it on stored runs against the next
fresh batch). A stage's certificate (Theorem 3.6) is the sum of its updates'; each holds at
95%, all n of a stage at once at 1 - n * 5% at least.

Columns: `updates.surrogate_gain` = mean X, `penalty` = span * mean Y + z * se, `certificate`; MLflow
`stage/certificate` sums a stage's certificates, `stage/certified` counts the positive ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.6448536269514722  # one-sided 95% quantile of the standard normal


@dataclass
class Segment:
    """One action of an episode, in turn order: its tokens' ratios rho (acted tokens only) and, for the
    acting agent's actions, their advantages in reward units."""

    agent: str
    ratio: np.ndarray
    adv: np.ndarray | None = None


def episode_terms(segments: list[Segment], acting: str, changed: set[str]) -> tuple[float, float]:
    """(X, Y) of one episode for the update of `acting`, with `changed` (C) updated since the batch."""
    keep = [s for s in segments if s.agent == acting or s.agent in changed]
    if not keep:
        return 0.0, 0.0
    rho = np.concatenate([np.asarray(s.ratio, np.float64) for s in keep])
    mine = np.concatenate([np.full(len(s.ratio), s.agent == acting) for s in keep])
    in_c = ~mine
    adv = np.concatenate([np.asarray(s.adv, np.float64) if s.agent == acting else np.zeros(len(s.ratio)) for s in keep])
    dev = np.abs(rho - 1)
    # after_h = sum_{t > h} (1 - rho_t)_+ over C + {i}
    drop = np.clip(1 - rho, 0, None)
    after = np.cumsum(drop[::-1])[::-1] - drop
    # stale_h = sum_{t < h, t in C} W_t |rho_t - 1|,  W_t = prod_{t' < t, t' in C} rho_t'
    log_w = np.concatenate([[0.0], np.cumsum(np.where(in_c, np.log(rho), 0.0))[:-1]])
    stale = np.cumsum(np.where(in_c, np.exp(log_w) * dev, 0.0)) - np.where(in_c, np.exp(log_w) * dev, 0.0)
    x = float(np.sum(np.where(mine, (rho - 1) * adv, 0.0)))  # X = sum_{h in I_i} (rho_h - 1) A_h
    y = float(np.sum(np.where(mine, dev * (after + stale), 0.0)))
    return x, y


def team_advantages(
    rewards: dict[str, list[np.ndarray]], turns: dict[str, list[int]], groups: dict[str, str]
) -> dict[str, list[np.ndarray]]:
    """Per episode and action (turn order), the advantage of every token for the team's return:
    A_t = G_t - b, with G_t the sum of every later token reward of the episode, every agent's (the team's
    return-to-go, what J sums), and b the mean, over the group's other episodes, of the return from the
    start of the same turn (0 where none has it). b does not depend on the episode's own actions, so
    E_b[(rho_t - 1) b] = 0 and X stays an unbiased estimate of the surrogate; an agent's own return-to-go
    would leave out what its action does to the later agents' rewards."""
    returns: dict[str, list[np.ndarray]] = {}
    start: dict[tuple[str, int], dict[str, float]] = {}  # (group, turn) -> {episode: return from the turn's start}
    for e, rs in rewards.items():
        flat = np.concatenate(rs) if rs else np.zeros(0)
        g = np.cumsum(flat[::-1])[::-1]  # G_t = sum_{t' >= t} r_t'
        cuts = np.cumsum([0, *map(len, rs)])
        returns[e] = [g[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        for turn, part in zip(turns[e], returns[e]):
            start.setdefault((groups[e], turn), {})[e] = float(part[0]) if len(part) else 0.0
    out: dict[str, list[np.ndarray]] = {}
    for e, parts in returns.items():
        out[e] = []
        for turn, part in zip(turns[e], parts):
            others = [v for o, v in start[(groups[e], turn)].items() if o != e]
            out[e].append(part - (float(np.mean(others)) if others else 0.0))
    return out


@dataclass
class Bound:
    gain: float  # mean X: the surrogate gain, per episode, in reward units
    penalty_occ: float  # span * mean Y: the occupancy shift's bound
    penalty_est: float  # z * se: the sampling error's one-sided bound

    @property
    def penalty(self) -> float:
        return self.penalty_occ + self.penalty_est

    @property
    def certificate(self) -> float:
        """gain - penalty: a lower bound (95%) on the update's true improvement of J."""
        return self.gain - self.penalty


def cluster_se(v: np.ndarray, groups: list[str]) -> float:
    """Standard error of mean(v) with the observations clustered by group (inf for fewer than two groups)."""
    # se^2 = G / (G - 1) * sum_g (sum_{e in g} (v_e - mean v))^2 / N^2
    keys, idx = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    if len(keys) < 2:
        return math.inf
    sums = np.bincount(idx, weights=v - v.mean(), minlength=len(keys))
    return float(math.sqrt(len(keys) / (len(keys) - 1) * np.sum(sums**2)) / len(v))


def bound(x: np.ndarray, y: np.ndarray, groups: list[str], span: float, z: float = Z95) -> Bound:
    """The certificate from per-episode X, Y (episode_terms), their groups and the return range `span`."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not len(x):
        return Bound(0.0, 0.0, math.inf)
    return Bound(float(x.mean()), span * float(y.mean()), z * cluster_se(x - span * y, groups))
