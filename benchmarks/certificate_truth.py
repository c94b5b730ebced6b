"""TeamTR's certificate (tasks/certificate.py) against the exact improvement, on small tabular teams.

    .venv/bin/python benchmarks/certificate_truth.py            # --write: replace its benchmarks/README.md section

The teams, their exact dynamic programming and the update (a natural-gradient step whose per-state
KL(pi || pi_new) is exactly delta) are benchmarks/occupancy_scaling.py's. Each stage updates agents
1..n once each in turn order, as `teamtr` (each update on the mid-update team's occupancy: nothing changed
since its batch) or `stale` (every update on the stage-start team's occupancy: the agents before it changed
since). For every update it computes exactly

  dJ   = J(pi^i) - J(pi^(i-1)), the true improvement;
  E[X] = the surrogate gain sum_h E_b[(rho_h - 1) A_h] on the batch team's occupancy;
  E[Y] = the occupancy penalty of tasks/certificate.py, by dynamic programming over the context states;
  certificate = E[X] - span * E[Y] (span = max R - min R, the range of returns),

the certificate in expectation, which tasks/certificate.py's theorem says never exceeds dJ. It reports the
worst slack dJ - certificate over all updates (a negative value would be a violated bound) and, among
the updates that improved J, the share the certificate certified (> 0), per delta. A second check samples
`--episodes` episodes of the batch team per update, computes the estimated certificate with
tasks/certificate.py itself (advantage R - the batch's mean R, episodes as groups, 95% one-sided), and
reports how often it exceeds dJ (the confidence level allows 5%).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)), sys.path.insert(0, str(HERE.parent))
import occupancy_scaling as occ  # noqa: E402

from benchmarks.common import write_section  # noqa: E402
from tasks.certificate import Segment, bound, episode_terms  # noqa: E402

README = HERE / "README.md"
SECTION = "## TeamTR certificate vs the exact improvement (`benchmarks/certificate_truth.py`)"


def exact_penalty(team: occ.Team, pi_b: np.ndarray, pi_now: np.ndarray, acting: int, changed: set[int]) -> float:
    """E_b[Y] of tasks/certificate.py, exactly: the batch's team pi_b, the team now pi_now (agents
    changed + {acting} differ), ratios rho = pi_now / pi_b per agent's table."""
    n, tok = len(pi_b), team.tokens
    H, K = n * tok, len(team.rho0)
    rho = pi_now / pi_b
    moved = changed | {acting}
    # B_h(s) = E_b[sum_{t >= h, t in C + i} (1 - rho_t)_+ | s_h = s], backward
    B = np.zeros((H + 1, K))
    for h in reversed(range(H)):
        j = h // tok
        drop = np.clip(1 - rho[j], 0, None) if j in moved else 0.0
        B[h] = (pi_b[j] * (drop + team.P[j] @ B[h + 1])).sum(-1)
    # forward: d = batch occupancy; dw(s) = E_b[W_h 1{s_h = s}]; m(s) = E_b[stale_h 1{s_h = s}]
    d, dw, m, total = team.rho0, team.rho0, np.zeros(K), 0.0
    for h in range(H):
        j = h // tok
        dev = np.abs(rho[j] - 1)
        if j == acting:  # E[|rho_h - 1| (after_h + stale_h)]
            total += np.einsum("s,sa,sa->", d, pi_b[j] * dev, team.P[j] @ B[h + 1])
            total += np.einsum("s,sa->", m, pi_b[j] * dev)
        m = np.einsum("s,sa,sat->t", m, pi_b[j], team.P[j])
        if j in changed:
            m = m + np.einsum("s,sa,sat->t", dw, pi_b[j] * dev, team.P[j])
            dw = np.einsum("s,sa,sat->t", dw, pi_b[j] * rho[j], team.P[j])
        else:
            dw = np.einsum("s,sa,sat->t", dw, pi_b[j], team.P[j])
        d = np.einsum("s,sa,sat->t", d, pi_b[j], team.P[j])
    return float(total)


def sampled_certificate(
    team: occ.Team,
    pi_b: np.ndarray,
    pi_now: np.ndarray,
    acting: int,
    changed: set[int],
    episodes: int,
    rng: np.random.Generator,
) -> float:
    """tasks/certificate.py's estimate from `episodes` episodes sampled by the batch team pi_b."""
    n, tok = len(pi_b), team.tokens
    s = rng.choice(len(team.rho0), size=episodes, p=team.rho0)
    ratio = np.ones((episodes, n * tok))
    for h in range(n * tok):
        j = h // tok
        p = pi_b[j][s]
        a = (rng.uniform(size=(episodes, 1)) > p.cumsum(1)).sum(1).clip(max=p.shape[1] - 1)
        ratio[:, h] = pi_now[j][s, a] / p[np.arange(episodes), a]
        q = team.P[j][s, a]
        s = (rng.uniform(size=(episodes, 1)) > q.cumsum(1)).sum(1).clip(max=q.shape[1] - 1)
    adv = team.R[s] - team.R[s].mean()  # the outcome minus the batch's mean: an unbiased advantage here
    terms = [
        episode_terms(
            [
                Segment(str(j), ratio[e, j * tok : (j + 1) * tok], np.full(tok, adv[e]) if j == acting else None)
                for j in range(n)
            ],
            str(acting),
            {str(c) for c in changed},
        )
        for e in range(episodes)
    ]
    x, y = map(np.array, zip(*terms))
    return bound(x, y, [str(e) for e in range(episodes)], float(team.R.max() - team.R.min())).certificate


def stage(
    team: occ.Team, pi: np.ndarray, delta: float, mid: bool, episodes: int = 0, rng: np.random.Generator | None = None
) -> list[dict]:
    """Update agents 1..n in turn order (mid: teamtr, else stale); one record per update."""
    pi0, pi = pi.copy(), pi.copy()
    span = float(team.R.max() - team.R.min())
    rows = []
    for i in range(len(pi)):
        pi_b = pi.copy() if mid else pi0
        changed = set() if mid else set(range(i))
        d, A = occ.occupancy(team, pi_b), occ.advantages(team, pi_b)[0]
        turn = slice(i * team.tokens, (i + 1) * team.tokens)
        new = occ.natural_step(pi_b[i], occ.turn_advantage(d[turn], A[turn]), delta)
        before = pi.copy()
        pi[i] = new
        gain = occ.surrogate(d[turn], A[turn], new)  # E_b[X] (E_b[A] = 0 on every state)
        y = exact_penalty(team, pi_b, pi, i, changed)
        row = {
            "agent": i,
            "gain": gain,
            "penalty": span * y,
            "certificate": gain - span * y,
            "dJ": occ.expected_return(team, pi) - occ.expected_return(team, before),
        }
        if episodes:
            row["sampled"] = sampled_certificate(team, pi_b, pi, i, changed, episodes, rng)
        rows.append(row)
    return rows


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    rng = np.random.default_rng(args.sample_seed)
    for n in range(2, args.n_max + 1):
        for delta in args.deltas:
            for j in range(args.teams):
                full, pi = occ.random_team(
                    np.random.default_rng(j), args.n_max, args.states, args.actions, args.tokens, args.rewrite
                )
                team, pi_n = occ.prefix(full, pi, n)
                for name, mid in (("teamtr", True), ("stale", False)):
                    sample = args.episodes if j < args.sampled_teams else 0
                    for r in stage(team, pi_n, delta, mid, sample, rng):
                        rows.append({"n": n, "delta": delta, "strategy": name, "team": j, **r})
    return rows


def report(args: argparse.Namespace) -> str:
    import pandas as pd

    t0 = time.perf_counter()
    df = pd.DataFrame(measure(args))
    wall = time.perf_counter() - t0
    df["slack"] = df["dJ"] - df["certificate"]
    command = " ".join([".venv/bin/python benchmarks/certificate_truth.py", *sys.argv[1:]])
    tr = df[df["strategy"] == "teamtr"]
    lines = [
        SECTION,
        "",
        (
            f"Command: `{command}` (exact dynamic programming, {wall:.0f} s on {platform.machine()}, "
            f"{os.cpu_count()} cores). Derivation of the bound: the docstring of tasks/certificate.py; the "
            "check: this script's docstring."
        ),
        "",
        (
            f"Settings: teams of n = 2..{args.n_max} agents, {args.tokens} tokens per message, {args.states} "
            f"context states, {args.actions} actions, rewrite probability <= {args.rewrite}, outcome reward in "
            f"[0, 1]; {args.teams} seeded teams per (n, delta); per-state KL of every update = delta. "
            f"{len(df)} updates in all ({len(tr)} teamtr, {len(df) - len(tr)} stale)."
        ),
        "",
        "| delta | updates | worst slack dJ - certificate (teamtr / stale) | improved J (teamtr) | "
        "certified of those (teamtr) | certified (stale) | mean certificate teamtr / stale |",
        "|---|---|---|---|---|---|---|",
    ]
    for delta, g in df.groupby("delta"):
        t, s = g[g["strategy"] == "teamtr"], g[g["strategy"] == "stale"]
        up = t[t["dJ"] > 0]
        lines.append(
            f"| {delta:g} | {len(g)} | {t['slack'].min():.2e} / {s['slack'].min():.2e} | {len(up)} | "
            f"{(up['certificate'] > 0).mean():.0%} | {(s[s['dJ'] > 0]['certificate'] > 0).mean():.0%} | "
            f"{t['certificate'].mean():.2e} / {s['certificate'].mean():.2e} |"
        )
    per_n = df.groupby(["n", "strategy"])["slack"].agg(["min", "size"]).unstack()
    lines += [
        "",
        "Per team size: "
        + "; ".join(
            f"n = {n}: {int(per_n.loc[n, ('size', 'teamtr')]) + int(per_n.loc[n, ('size', 'stale')])} updates, worst "
            f"slack {min(per_n.loc[n, ('min', 'teamtr')], per_n.loc[n, ('min', 'stale')]):.1e}"
            for n in per_n.index
        )
        + ".",
    ]
    smp = df.dropna(subset=["sampled"]) if "sampled" in df else df.iloc[0:0]
    if len(smp):
        over = smp["sampled"] > smp["dJ"]
        lines += [
            "",
            (
                f"Sampled estimate ({args.episodes} episodes per update, the first {args.sampled_teams} teams "
                f"of each (n, delta), {len(smp)} updates): it exceeded the true dJ in {over.mean():.1%} of the "
                f"updates (95% one-sided bound: at most about 5% expected); positive in "
                f"{(smp['sampled'] > 0).mean():.1%}."
            ),
        ]
    lines += [
        "",
        (
            f"How many episodes the sampled certificate needs (teamtr, n = 3, the first {args.sweep_teams} teams): "
            "share of updates certified / share whose certificate exceeded dJ."
        ),
        "",
        "| delta | " + " | ".join(f"{e} episodes" for e in args.sweep_episodes) + " |",
        "|---|" + "---|" * len(args.sweep_episodes),
    ]
    for delta in args.sweep_deltas:
        cells = []
        for e in args.sweep_episodes:
            rng = np.random.default_rng(args.sample_seed)
            got = [
                (r["sampled"], r["dJ"])
                for j in range(args.sweep_teams)
                for r in stage(
                    *occ.prefix(
                        *occ.random_team(
                            np.random.default_rng(j), args.n_max, args.states, args.actions, args.tokens, args.rewrite
                        ),
                        3,
                    ),
                    delta,
                    True,
                    e,
                    rng,
                )
            ]
            cert, dj = np.array(got).T
            cells.append(f"{(cert > 0).mean():.0%} / {(cert > dj).mean():.0%}")
        lines.append(f"| {delta:g} | " + " | ".join(cells) + " |")
    worst = df["slack"].min()
    lines += [
        "",
        (
            f"Reading: the certificate never exceeded the true improvement (worst slack {worst:.1e}"
            f"{', a violation' if worst < 0 else ' >= 0'}). It certifies only small steps: the penalty is "
            "second order in the step but is scaled by the whole range of returns, while the advantages "
            "here are about 1% of it (an early agent's token barely moves a [0, 1] outcome that later "
            "tokens rewrite), so the gain outweighs it only at small delta; stale's penalty adds the "
            "reweighting by every agent updated before, so it certifies less than teamtr at every delta. "
            "Estimated from a sample, a certificate also pays its "
            "sampling term, which shrinks only as one over the square root of the episodes: with a few "
            "hundred episodes the updates it certified were mostly those whose sampled gain happened to be "
            "high (certified and exceeding dJ alike), and it took thousands of episodes at delta <= 1e-5 to "
            "certify most improving updates. A training batch of 32 episodes at delta = 0.05 is far from "
            "both."
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--teams", type=int, default=30, help="seeded teams per (n, delta)")
    ap.add_argument("--deltas", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 5e-2])
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--states", type=int, default=6)
    ap.add_argument("--actions", type=int, default=4)
    ap.add_argument("--rewrite", type=float, default=0.05)
    ap.add_argument("--episodes", type=int, default=256, help="episodes per update for the sampled check")
    ap.add_argument("--sampled-teams", type=int, default=3, help="teams per (n, delta) that get the sampled check")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--sweep-deltas", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    ap.add_argument("--sweep-episodes", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    ap.add_argument("--sweep-teams", type=int, default=10, help="teams (of 3 agents) in the episodes sweep")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    text = report(args)
    print(text)
    if args.write:
        write_section(README, SECTION, text)


if __name__ == "__main__":
    main()
