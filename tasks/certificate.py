"""TeamTR's improvement certificate: a lower bound, at 95% confidence, on what one agent's update does
to the team's task return, estimated from question groups the update never saw, in reward units.

What it certifies. J(pi) = E[sum of an episode's task rewards] under the team pi: every scored action's
reward (its blended coach score and outcome, in [0, 1]), or, for a trajectory estimator, the episode's
outcome once. Not the KL-shaped return that training maximises: the task return is what a user measures,
and without the -beta * KL terms the bound holds whatever beta the update was trained with.

Setting. Agent i's update turns the team pi^{i-1} into pi^i. The batch was sampled by pi^b: pi^{i-1} when
it was resampled just before the update (`teamtr`), the stage-start team when it was cached (`stale`),
when the agents C updated since then differ too. Every token t the agents in C + {i} wrote in the batch
has a ratio rho_t = pi_now(a_t|s_t) / pi^b(a_t|s_t) (1 for every other agent's token).

Bound. The performance-difference lemma, taken from the old team's side, is exact:
    J(pi^i) - J(pi^{i-1}) = sum_h E_{pi^{i-1}}[(rho_h - 1) A^{pi^i}_h]        (h: agent i's tokens)
Two steps take it to the surrogate L = sum_h E_b[(rho_h - 1) A_h] with the batch team's advantages A:
  1. A^{pi^i} - A^{pi^b} at (s_h, a_h) is a difference of expected returns from the same point. Coupling
     the two continuations token by token (the new token equals the old with probability min(1, rho_t)),
     they differ only after a token of C + {i} diverged: |Q^{pi^i} - Q^{pi^b}| <= span * E[sum_{t > h}
     (1 - rho_t)_+], span the range of a return from any point.
  2. The occupancy of pi^{i-1} is the batch's reweighted by W_h = prod_{t < h, t in C} rho_t, and
     |W_h - 1| <= sum_{t < h, t in C} W_t |rho_t - 1| (telescoping); with |A^{pi^i}| <= span.
So, per episode of the batch,
    X = sum_{h in I_i} (rho_h - 1) A_h                                                  (surrogate gain)
    Y = sum_{h in I_i} |rho_h - 1| (sum_{t in I_{C+i}, t > h} (1 - rho_t)_+ + sum_{t in I_C, t < h} W_t |rho_t - 1|)
and  J(pi^i) - J(pi^{i-1}) >= E_b[X] - span * E_b[Y]  exactly, for every update, whatever made it.

Assumptions, each met by construction or checked where the certificate is computed (tasks/update.py):
  - span is known before the update (`return_span`): rewards lie in the pipeline's declared range and
    an episode has at most the pipeline's `max_actions()` actions. A batch outside them gets no
    certificate.
  - A is an unbiased advantage of the team's task return (`team_advantages`: the return-to-go minus a
    baseline from the group's other episodes, which does not depend on the episode's own actions).
  - The episodes certified are independent of the update: whole question groups are held out of it
    (`holdout_groups`, algorithm.certify_holdout) and the certificate is estimated on them only. Fitted
    on the same episodes, the gain would be optimistic by what the update fitted of their noise.
  - Held-out groups are independent draws of questions, and the group means of X - span * Y are close
    enough to normal for a Student-t interval with (groups - 1) degrees of freedom.

Estimate. certificate = mean(X - span * Y) - t_{0.95, G-1} * se over the G held-out groups, se clustered by
group (a group's episodes share a question and a baseline). A stage's certificate (Theorem 3.6) is the sum
of its updates', defined only when every applied update has one; each holds at 95%, all n of a stage at
once at 1 - n * 5% at least. Cost: the held-out groups train nobody, and measuring them is one more
forward pass of the units in C + {i} over their actions.

Columns: `updates.surrogate_gain` = mean X, `penalty` = span * mean Y + t * se, `certificate`; MLflow
`stage/task_certificate` sums a stage's certificates, `stage/certified` counts the positive ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95  # the certificate's one-sided confidence level


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


def holdout_groups(groups: list[str], share: float, rng: np.random.Generator) -> set[str]:
    """The question groups held out of an update, for its certificate: round(share * G) of the G groups,
    at least two (the estimation term needs two) and never all; none for share 0 or fewer than three groups."""
    keys = sorted(set(groups))
    if share <= 0 or len(keys) < 3:
        return set()
    k = min(max(2, round(share * len(keys))), len(keys) - 1)
    return set(rng.choice(keys, size=k, replace=False).tolist())


def reward_range(outcome_range: tuple[float, float], outcome_weight: float, trajectory: bool) -> tuple[float, float]:
    """Where every reward of an episode lies, from bounds known before the update: an action's blended
    score r = (1 - w) * coach / 10 + w * outcome with coach in [0, 10], or a trajectory's outcome; 0 for an
    unscored action (or an infrastructure fault's episode)."""
    lo, hi = outcome_range
    if not trajectory:
        lo, hi = outcome_weight * lo, (1 - outcome_weight) + outcome_weight * hi
    return min(lo, 0.0), max(hi, 0.0)


def return_span(max_actions: int, rewards: tuple[float, float], trajectory: bool) -> float:
    """The range of a task return from any point of an episode: span = (hi - lo) times the rewards an
    episode can collect (one for a trajectory reward, else one per action)."""
    return (1 if trajectory else max_actions) * (rewards[1] - rewards[0])


@dataclass
class Bound:
    gain: float  # mean X: the surrogate gain, per episode, in reward units
    penalty_occ: float  # span * mean Y: the occupancy shift's bound
    penalty_est: float  # t * se: the sampling error's one-sided bound

    @property
    def penalty(self) -> float:
        return self.penalty_occ + self.penalty_est

    @property
    def certificate(self) -> float:
        """gain - penalty: a lower bound (95%) on the update's true improvement of the task return J."""
        return self.gain - self.penalty


def cluster_se(v: np.ndarray, groups: list[str]) -> float:
    """Standard error of mean(v) with the observations clustered by group (inf for fewer than two groups)."""
    # se^2 = G / (G - 1) * sum_g (sum_{e in g} (v_e - mean v))^2 / N^2
    keys, idx = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    if len(keys) < 2:
        return math.inf
    sums = np.bincount(idx, weights=v - v.mean(), minlength=len(keys))
    return float(math.sqrt(len(keys) / (len(keys) - 1) * np.sum(sums**2)) / len(v))


def bound(x: np.ndarray, y: np.ndarray, groups: list[str], span: float, level: float = LEVEL) -> Bound:
    """The certificate from per-episode X, Y (episode_terms) of the held-out episodes, their groups and the
    return range `span`: mean(X - span Y) - t_{level, G-1} * se."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n_groups = len(set(groups))
    if n_groups < 2:
        return Bound(float(x.mean()) if len(x) else 0.0, span * float(y.mean()) if len(y) else 0.0, math.inf)
    t = float(stats.t.ppf(level, n_groups - 1))
    return Bound(float(x.mean()), span * float(y.mean()), t * cluster_se(x - span * y, groups))
