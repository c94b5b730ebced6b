"""TeamTR's certificate (tasks/certificate.py) against the exact improvement of small teams.

    .venv/bin/python benchmarks/certificate_truth.py            # --write: replace its benchmarks/README.md section

Teams. n agents take turns, each writing `tokens` tokens from a vocabulary of two. Every token's policy
is a softmax table over the whole history so far (a prefix tree: the state is the prefix, as for a
language model), and each agent's last token earns a task reward r(q, prefix) ~ U(0, 1), the coach's
score of its action; q is the question (one in the exact check). Training shapes every token's reward
with -beta * log(pi / pi_ref) (k1, pi_ref the initial team), as the pipeline does; the certificate is for
the task return J alone, span = tasks/certificate.return_span (n actions, rewards in [0, 1]).

Exact check. All 2^(n * tokens) episodes are enumerated with their probabilities under the batch team, so
E_b[X] and E_b[Y] are the probability-weighted sums of the shipped `episode_terms` over every episode,
with the exact advantages of the batch team's task return, and the certificate is
Bound(E_b[X], span * E_b[Y], 0): the bound without sampling error, which the theorem says never exceeds
dJ = J(pi^i) - J(pi^(i-1)), computed exactly. Updates move agent i's logits by eta times a direction:
the exact KL-shaped advantage of the batch team (aligned), its negative (anti-aligned) or N(0, 1)
(random), eta from 1e-4 to 3; `teamtr` (the batch team is the mid-update team) and `stale` (the
stage-start team, the agents before i changed since).

Sampled check. Q questions, uniform; the policy does not see q, so an update fitted on some questions
moves all. A batch is `questions` x `group` episodes sampled by the team; the update of agent i is
fitted on it, one policy-gradient step on the KL-shaped returns minus their group's mean, over the
groups it trains on. The certificate comes from the shipped functions: `holdout_groups`,
`team_advantages`, `episode_terms` and `bound` on the held-out groups only (what tasks/update.py does);
the in-sample variant fits and certifies on every group (what the pipeline did before the held-out
groups). Each is compared with the exact dJ over the question distribution: a 95% bound may exceed it
in at most about 5% of updates.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tasks.certificate as cert  # noqa: E402  (a module, so that a test can mutate its functions)
from benchmarks.common import write_section  # noqa: E402
from tasks.evaluation import clopper_pearson  # noqa: E402

README = HERE / "README.md"
SECTION = "## TeamTR certificate vs the exact improvement (`benchmarks/certificate_truth.py`)"
DIRECTIONS = ("aligned", "anti-aligned", "random")


class Team(NamedTuple):
    n: int  # agents
    tokens: int  # tokens per agent's action
    R: dict[int, np.ndarray]  # last position of an action -> (questions, 2^(h+1)) rewards by prefix through h
    ref: list[np.ndarray]  # reference logits per position, (2^h, 2)
    ref_probs: list[np.ndarray]  # their softmax, computed once

    @property
    def H(self) -> int:
        return self.n * self.tokens

    def owner(self, h: int) -> int:
        return h // self.tokens


def random_team(rng: np.random.Generator, n: int, tokens: int, questions: int = 1) -> tuple[Team, list[np.ndarray]]:
    """A seeded team and its initial logits, which are also its reference."""
    H = n * tokens
    logits = [rng.normal(size=(2**h, 2)) for h in range(H)]
    R = {(i + 1) * tokens - 1: rng.uniform(size=(questions, 2 ** ((i + 1) * tokens))) for i in range(n)}
    ref = [x.copy() for x in logits]
    return Team(n, tokens, R, ref, probs(ref)), logits


def probs(logits: list[np.ndarray]) -> list[np.ndarray]:
    # pi(a | prefix) = exp(l_a) / sum_b exp(l_b)
    return [np.exp(x - np.logaddexp(x[:, :1], x[:, 1:])) for x in logits]


def values(team: Team, pi: list[np.ndarray], q: int, beta: float = 0.0) -> tuple[float, list[np.ndarray]]:
    """J and the advantages A_h(prefix, a) of question q's return, KL-shaped with beta (0: the task's)."""
    V, A = np.zeros(2**team.H), [np.empty(0)] * team.H
    ref = team.ref_probs
    for h in reversed(range(team.H)):
        r = team.R[h][q].reshape(-1, 2) if h in team.R else 0.0
        Q = r - beta * np.log(pi[h] / ref[h]) + V.reshape(-1, 2)  # children of prefix p: 2p, 2p + 1
        V = (pi[h] * Q).sum(1)
        A[h] = Q - V[:, None]
    return float(V[0]), A


def task_return(team: Team, pi: list[np.ndarray]) -> float:
    return float(np.mean([values(team, pi, q)[0] for q in range(len(team.R[team.H - 1]))]))


def episodes(H: int) -> tuple[np.ndarray, np.ndarray]:
    """Every episode's actions (2^H, H), first action the highest bit, and its prefix index at each h."""
    code = np.arange(2**H)
    return (code[:, None] >> np.arange(H)[::-1]) & 1, code[:, None] >> (H - np.arange(H))


def token_probs(pi: list[np.ndarray], acts: np.ndarray, pre: np.ndarray) -> np.ndarray:
    return np.stack([pi[h][pre[:, h], acts[:, h]] for h in range(acts.shape[1])], 1)


def terms(team: Team, rho: np.ndarray, adv: np.ndarray, acting: int, changed: set[int]) -> tuple[np.ndarray, ...]:
    """Per episode (X, Y) of tasks/certificate.episode_terms, from token ratios and the acting agent's advantages."""
    t, moved = team.tokens, sorted(changed | {acting})
    out = [
        cert.episode_terms(
            [
                cert.Segment(str(j), rho[e, j * t : (j + 1) * t], adv[e, j * t : (j + 1) * t] if j == acting else None)
                for j in moved
            ],
            str(acting),
            {str(c) for c in changed},
        )
        for e in range(len(rho))
    ]
    return tuple(map(np.array, zip(*out)))


def exact_certificate(team: Team, pi_b, pi_now, acting: int, changed: set[int]) -> tuple[float, float]:
    """(E_b[X], E_b[X] - span * E_b[Y]) over every episode, exactly."""
    acts, pre = episodes(team.H)
    p_b = token_probs(pi_b, acts, pre)
    _, A = values(team, pi_b, 0)
    adv = np.stack([A[h][pre[:, h], acts[:, h]] for h in range(team.H)], 1)
    x, y = terms(team, token_probs(pi_now, acts, pre) / p_b, adv, acting, changed)
    w = p_b.prod(1)
    span = cert.return_span(team.n, cert.reward_range((0.0, 1.0), 0.0, False), False)
    b = cert.Bound(float(w @ x), span * float(w @ y), 0.0)
    return b.gain, b.certificate


def direction(team: Team, pi_b, kind: str, beta: float, h: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "random":
        return rng.normal(size=pi_b[h].shape)
    A = values(team, pi_b, 0, beta)[1][h]
    return A if kind == "aligned" else -A


def exact_stage(team: Team, logits, eta: float, kind: str, beta: float, mid: bool, rng) -> list[dict]:
    """Update agents 0..n-1 in turn (mid: teamtr, else stale); one row per update."""
    start, now = [x.copy() for x in logits], [x.copy() for x in logits]
    rows = []
    for i in range(team.n):
        pi_b = probs(now if mid else start)
        new = [x.copy() for x in now]
        for h in range(i * team.tokens, (i + 1) * team.tokens):
            new[h] = now[h] + eta * direction(team, pi_b, kind, beta, h, rng)
        gain, c = exact_certificate(team, pi_b, probs(new), i, set() if mid else set(range(i)))
        dj = task_return(team, probs(new)) - task_return(team, probs(now))
        rows.append({"gain": gain, "certificate": c, "dJ": dj})
        now = new
    return rows


def exact_rows(teams: int, shapes, etas, betas) -> list[dict]:
    rows = []
    for n, tokens in shapes:
        for j in range(teams):
            team, logits = random_team(np.random.default_rng([n, tokens, j]), n, tokens)
            rng = np.random.default_rng([n, tokens, j, 1])
            for beta in betas:
                for eta in etas:
                    for kind in DIRECTIONS:
                        for name, mid in (("teamtr", True), ("stale", False)):
                            for r in exact_stage(team, logits, eta, kind, beta, mid, rng):
                                rows.append({"n": n, "tokens": tokens, "beta": beta, "eta": eta, "direction": kind,
                                             "strategy": name, "team": j} | r)  # fmt: skip
    return rows


def sample(team: Team, pi, qs: np.ndarray, group: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`group` episodes per question of qs: actions, prefixes and question per episode."""
    q = np.repeat(qs, group)
    acts, pre = np.zeros((len(q), team.H), int), np.zeros((len(q), team.H), int)
    for h in range(team.H):
        acts[:, h] = rng.uniform(size=len(q)) > pi[h][pre[:, h], 0]
        if h + 1 < team.H:
            pre[:, h + 1] = 2 * pre[:, h] + acts[:, h]
    return acts, pre, q


def task_rewards(team: Team, acts, pre, q) -> np.ndarray:
    """(episodes, H) token rewards: each action's reward on its last token."""
    r = np.zeros(acts.shape)
    for h, R in team.R.items():
        r[:, h] = R[q, 2 * pre[:, h] + acts[:, h]]
    return r


def fit(team: Team, now, pi_b, acts, pre, q, train: np.ndarray, agent: int, eta: float, beta: float, group: int):
    """Agent's logits after one policy-gradient step on the KL-shaped returns minus their group's mean."""
    ref, p_b = team.ref_probs, token_probs(pi_b, acts, pre)
    shaped = task_rewards(team, acts, pre, q) - beta * np.log(p_b / token_probs(ref, acts, pre))
    G = shaped.sum(1)
    a = G - np.repeat(G.reshape(-1, group).mean(1), group)
    new = [x.copy() for x in now]
    for h in range(agent * team.tokens, (agent + 1) * team.tokens):
        grad = np.zeros_like(now[h])  # d log pi(a|s) / d logits = onehot(a) - pi(.|s)
        for e in np.flatnonzero(train):
            grad[pre[e, h]] += a[e] * (np.eye(2)[acts[e, h]] - pi_b[h][pre[e, h]])
        new[h] = now[h] + eta * grad / max(1, train.sum())
    return new


def sampled_certificate(team: Team, pi_b, pi_now, acts, pre, q, keep: np.ndarray, groups, agent, changed) -> float:
    """The shipped estimate (tasks/update.py's measure_update) on the episodes `keep`."""
    t, r = team.tokens, task_rewards(team, acts, pre, q)[keep]
    names = [f"e{k}" for k in range(int(keep.sum()))]
    g = dict(zip(names, np.asarray(groups)[keep]))
    adv = cert.team_advantages({e: [r[k, j * t : (j + 1) * t] for j in range(team.n)] for k, e in enumerate(names)},
                               {e: list(range(team.n)) for e in names}, g)  # fmt: skip
    A = np.stack([np.concatenate(adv[e]) for e in names])
    rho = (token_probs(pi_now, acts, pre) / token_probs(pi_b, acts, pre))[keep]
    x, y = terms(team, rho, A, agent, changed)
    span = cert.return_span(team.n, cert.reward_range((0.0, 1.0), 0.0, False), False)
    return cert.bound(x, y, list(g.values()), span).certificate


def sampled_rows(stages: int, etas, betas, questions=8, group=4, share=0.25, n=3, tokens=2, Q=16) -> list[dict]:
    rows = []
    for k in range(stages):
        team, logits = random_team(np.random.default_rng([7, k]), n, tokens, Q)
        for beta in betas:
            for eta in etas:
                for name, mid in (("teamtr", True), ("stale", False)):
                    rng = np.random.default_rng([8, k, int(eta * 100), int(beta * 1000), mid])
                    for holdout in (share, 0.0):
                        start, now, batch = logits, [x.copy() for x in logits], None
                        for i in range(n):
                            if mid or batch is None:  # teamtr resamples before every agent
                                batch = sample(team, probs(now), rng.integers(Q, size=questions), group, rng)
                                groups = np.repeat([f"g{j}" for j in range(questions)], group)
                                held = cert.holdout_groups(list(groups), holdout, rng)
                                test = np.isin(groups, list(held)) if held else np.ones(len(groups), bool)
                            pi_b = probs(now if mid else start)
                            new = fit(team, now, pi_b, *batch, ~test if held else test, i, eta, beta, group)
                            c = sampled_certificate(team, pi_b, probs(new), *batch, test, groups, i,
                                                    set() if mid else set(range(i)))  # fmt: skip
                            dj = task_return(team, probs(new)) - task_return(team, probs(now))
                            rows.append({"stage": k, "beta": beta, "eta": eta, "strategy": name, "agent": i,
                                         "certified_on": "held-out" if holdout else "in-sample",
                                         "certificate": c, "dJ": dj})  # fmt: skip
                            now = new
    return rows


def report(args: argparse.Namespace) -> str:
    import pandas as pd

    t0 = time.perf_counter()
    ex = pd.DataFrame(exact_rows(args.teams, SHAPES, ETAS, BETAS))
    sm = pd.DataFrame(sampled_rows(args.stages, SAMPLED_ETAS, BETAS))
    wall = time.perf_counter() - t0
    ex["slack"] = ex["dJ"] - ex["certificate"]
    lines = [
        SECTION,
        "",
        f"Command: `{' '.join(['.venv/bin/python benchmarks/certificate_truth.py', *sys.argv[1:]])}` ({wall:.0f} s "
        f"on {platform.machine()}, {os.cpu_count()} cores). The bound: tasks/certificate.py; the checks: this "
        "script's docstring.",
        "",
        f"Exact: {len(ex)} updates of teams of (agents, tokens per action) in {SHAPES}, {args.teams} seeded teams "
        f"each, beta in {BETAS}, eta in {ETAS}, three directions, teamtr and stale.",
        "",
        "| beta | direction | updates | violations (certificate > dJ + 1e-12) | worst slack dJ - certificate | "
        "improved J | certified of those (eta <= 1e-3) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (beta, kind), g in ex.groupby(["beta", "direction"]):
        up = g[(g["dJ"] > 0) & (g["eta"] <= 1e-3)]
        share = f"{(up['certificate'] > 0).mean():.0%}" if len(up) else "-"
        lines.append(
            f"| {beta:g} | {kind} | {len(g)} | {int((g['slack'] < -1e-12).sum())} | {g['slack'].min():.1e} | "
            f"{int((g['dJ'] > 0).sum())} | {share} |"
        )
    bad = int((ex["slack"] < -1e-12).sum())
    lo, hi = clopper_pearson(bad, len(ex))
    lines += [
        "",
        f"Violations in all: {bad} of {len(ex)}, Clopper-Pearson 95% [{lo:.2%}, {hi:.2%}]; a slack of -1e-15 is "
        "float rounding where the bound is tight (one token, no agent changed: the surrogate is exact).",
    ]
    lines += [
        "",
        f"Sampled: {len(sm)} fitted updates ({args.stages} teams of 3 agents x 2 tokens, 16 questions; batches of "
        f"8 questions x 4 episodes; beta in {BETAS}, step in {SAMPLED_ETAS}). Share of updates whose 95% "
        "certificate exceeded the exact dJ, and share positive:",
        "",
        "| certified on | strategy | updates | exceeded dJ (Clopper-Pearson 95%) | positive |",
        "|---|---|---|---|---|",
    ]
    for (on, name), g in sm.groupby(["certified_on", "strategy"]):
        k = int((g["certificate"] > g["dJ"]).sum())
        lo, hi = clopper_pearson(k, len(g))
        positive = (g["certificate"] > 0).mean()
        lines.append(f"| {on} | {name} | {len(g)} | {k / len(g):.1%} [{lo:.1%}, {hi:.1%}] | {positive:.1%} |")
    return "\n".join(lines) + "\n"


SHAPES = ((2, 1), (2, 2), (3, 1), (3, 2), (4, 1))
ETAS = (1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0)
BETAS = (0.0, 0.01)
SAMPLED_ETAS = (1.0, 4.0, 16.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teams", type=int, default=10, help="seeded teams per shape in the exact check")
    ap.add_argument("--stages", type=int, default=60, help="seeded teams in the sampled check")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    text = report(args)
    print(text)
    if args.write:
        write_section(README, SECTION, text)


if __name__ == "__main__":
    main()
