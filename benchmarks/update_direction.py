"""Does an update move the policy the way its advantages say (any pipeline)? For a finished run's
iterations, each scored rollout action with a non-zero advantage is scored again, at the weights before
and after that iteration's update (the `updates` table's versions, at the rollout's temperature), and the change of its
mean token log-prob is set against the sign of its advantage.

    .venv/bin/python benchmarks/update_direction.py --run RUN_DIR --iterations 1 3 5 [--write]

Per iteration and role: the actions with A > 0 and A < 0 and their mean log-prob change, and the
correlation of A with the change. A correct update raises the first and lowers the second. The gap between
the logged log-probs and those recomputed before the update checks that the actions are scored as they
were sampled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import machine, write_section  # noqa: E402

README = ROOT / "benchmarks" / "README.md"
SECTION = "## Does an update move the way its advantages say? (`benchmarks/update_direction.py`)"


def scored_actions(run_dir: Path, iteration: int) -> pd.DataFrame:
    """The iteration's rollout actions with their mean advantage `A`, those with A != 0."""
    from infra import store

    acts, adv = store.read_table(run_dir, "actions"), store.read_table(run_dir, "advantages")
    keys = ["episode_id", "turn", "agent"]
    a = acts[(acts["iteration"] == iteration) & (acts["phase"] == "rollout")]
    d = adv[(adv["iteration"] == iteration) & (adv["phase"] == "rollout")][[*keys, "advantages"]]
    m = a.merge(d, on=keys)
    m["A"] = [float(np.mean(x)) if len(x) else 0.0 for x in m["advantages"]]
    return m[m["A"] != 0].reset_index(drop=True)


def mean_logprobs(policy, run_dir: Path, rows: pd.DataFrame, version_of: dict[str, int], temperature: float):
    """Each row's mean token log-prob under its agent's weights at `version_of[unit]`."""
    from infra.generation import response_logprobs

    out = np.zeros(len(rows))
    for agent, g in rows.groupby("agent"):
        policy.load(run_dir, agent, version_of[policy.unit(agent)])
        with torch.no_grad(), policy.acting(agent) as model:
            for i in range(0, len(g), 4):
                chunk = g.iloc[i : i + 4]
                responses = [list(r) for r in chunk["response_ids"]]
                lp = response_logprobs(
                    model, [list(p) for p in chunk["prompt_ids"]], responses, policy.tokenizer.pad_token_id, temperature
                )
                out[chunk.index] = [float(lp[j, : len(r)].mean()) for j, r in enumerate(responses)]
    return out


def direction(run_dir: Path, iteration: int) -> pd.DataFrame:
    """Per role: counts and mean log-prob change of the actions with A > 0 and A < 0, corr(A, change), and the
    largest gap between logged and recomputed log-probs before the update."""
    from infra import store
    from tasks.context import RunContext

    with RunContext(run_dir) as ctx:
        return change_by_role(ctx, run_dir, iteration, store.read_table(run_dir, "updates"))


def change_by_role(ctx, run_dir: Path, iteration: int, ups: pd.DataFrame) -> pd.DataFrame:
    rows = scored_actions(run_dir, iteration)
    ups = ups[(ups["iteration"] == iteration) & ~ups["skipped"].astype(bool)]
    before = dict(zip(ups["agent"], ups["version_before"]))
    after = dict(zip(ups["agent"], ups["version_after"]))
    rows = rows[[ctx.policy.unit(a) in before for a in rows["agent"]]].reset_index(drop=True)
    temperature = ctx.config.rollout.temperature
    lp0 = mean_logprobs(ctx.policy, run_dir, rows, before, temperature)
    rows["change"] = mean_logprobs(ctx.policy, run_dir, rows, after, temperature) - lp0
    rows["gap"] = np.abs(np.array([float(np.mean(x)) for x in rows["logprobs"]]) - lp0)
    out = []
    for agent, g in rows.groupby("agent"):
        pos, neg = g[g["A"] > 0], g[g["A"] < 0]
        corr = float(np.corrcoef(g["A"], g["change"])[0, 1]) if len(pos) and len(neg) else float("nan")
        out.append(
            {
                "iteration": iteration,
                "role": agent,
                "n_pos": len(pos),
                "change_pos": pos["change"].mean(),
                "n_neg": len(neg),
                "change_neg": neg["change"].mean(),
                "corr": corr,
                "max_gap": g["gap"].max(),
            }
        )
    return pd.DataFrame(out)


def table(run_dir: Path, frames: list[pd.DataFrame]) -> str:
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python benchmarks/update_direction.py --run {run_dir} --iterations "
        f"{' '.join(str(int(f['iteration'].iloc[0])) for f in frames if len(f))} --write`; {machine()}. "
        "Mean token log-prob change of the rollout actions from before to after the iteration's update, by "
        "the sign of their advantage; the logged log-probs and those recomputed before the update differ by "
        "at most `max gap`.",
        "",
        "| run | iteration | role | A > 0: n, change | A < 0: n, change | corr(A, change) | max gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in frames:
        for r in f.itertuples():
            lines.append(
                f"| {run_dir.name} | {r.iteration} | {r.role} | {r.n_pos}, {r.change_pos:+.3f} | "
                f"{r.n_neg}, {r.change_neg:+.3f} | {r.corr:+.2f} | {r.max_gap:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished run's folder")
    ap.add_argument("--iterations", type=int, nargs="+", required=True)
    ap.add_argument("--write", action="store_true", help=f"replace the section in {README.relative_to(ROOT)}")
    args = ap.parse_args()
    torch.set_num_threads(1)
    text = table(args.run, [direction(args.run, it) for it in args.iterations])
    print(text)
    if args.write:
        write_section(README, SECTION, text)


if __name__ == "__main__":
    main()
