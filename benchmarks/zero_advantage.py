"""What skipping zero-advantage samples saves in an update (infra/trainer.py `accumulate`, `skip_zero`): the
updates of a finished run, each redone from the weights it started from, once with every sample's forward
pass and once without those whose advantages are all 0 (GRPO groups whose trajectories all scored alike),
one after the other in one process. Reports the seconds of each, their ratio, and how far apart the two
updates land: |dw_skip - dw_all| / |dw_all| over the trained weights. The gradients agree up to float
rounding (the micro-batches differ), but AdamW divides each gradient by its running scale, so a weight
whose gradient is near 0 moves by about the learning rate either way, in a direction rounding picks: the
largest single-weight difference is of the order of lr x steps and says nothing about the skip. For scale,
the same update with every sample and twice the micro-batch size (the same gradient, other rounding) is
compared with the first the same way.

    .venv/bin/python benchmarks/zero_advantage.py --run /work/mars-runs/mars-shared-s1 --iterations 1 3 5 --write

Writes benchmarks/zero_advantage.csv and, with --write, the section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import Section, machine, write_section  # noqa: E402
from infra import store  # noqa: E402
from infra.runs import read_run_config  # noqa: E402
from infra.trainer import zero_advantage  # noqa: E402
from tasks.context import RunContext  # noqa: E402
from tasks.update import batch_of, loss_of, spec_of  # noqa: E402

OUT = ROOT / "benchmarks" / "zero_advantage.csv"
TITLE = "Updates without zero-advantage samples (`benchmarks/zero_advantage.py`)"


def redo(ctx: RunContext, iteration: int, unit: str) -> dict:
    """One recorded update of `unit` at `iteration`, trained each way from its starting weights."""
    run_dir = ctx.run_dir
    row = store.read_table(run_dir, "updates", iteration, "rollout").set_index("agent").loc[unit]
    before = int(row["version_before"])
    items, _ = batch_of(ctx, iteration, "rollout", unit)
    spec = spec_of(ctx, iteration, "rollout", unit, before)
    out: dict = {"iteration": iteration, "unit": unit, "samples": len(items)}
    out["zero-advantage samples"] = sum(map(zero_advantage, items))
    ctx.policy.load(run_dir, unit, before)
    params = ctx.policy.parameters(unit)
    with ctx.policy.materialized(unit):
        start = [p.detach().clone() for p in params]
    ways = {
        "s, every sample": replace(spec, skip_zero_advantage=False),
        "s, skipping": replace(spec, skip_zero_advantage=True),
        "micro-batches x2": replace(spec, skip_zero_advantage=False, micro_batch_size=2 * spec.micro_batch_size),
    }
    moved = {}
    for name, way in ways.items():
        # each way from the starting weights (policy.load would see them as loaded and leave them trained)
        with torch.no_grad(), ctx.policy.materialized(unit, modify=True):
            for p, p0 in zip(params, start):
                p.copy_(p0)
        res, _ = ctx.trainer().train(ctx.policy, unit, items, loss_of(ctx), way)
        out[name] = round(res.seconds, 1)
        with ctx.policy.materialized(unit):
            moved[name] = torch.cat([(p.detach() - p0).reshape(-1) for p, p0 in zip(params, start)])
    del out["micro-batches x2"]  # timed only for its rounding
    base = moved["s, every sample"]
    out["ratio"] = round(out["s, skipping"] / out["s, every sample"], 3)
    out["update difference, skipping"] = float((moved["s, skipping"] - base).norm() / base.norm())
    out["update difference, micro-batches x2"] = float((moved["micro-batches x2"] - base).norm() / base.norm())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a finished run folder")
    ap.add_argument("--iterations", type=int, nargs="+", required=True)
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/README.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    with RunContext(args.run) as ctx:
        rows = [redo(ctx, i, u) for i in args.iterations for u in ctx.units]
    df = pd.DataFrame(rows)
    df.to_csv(OUT, index=False)
    print(df.to_string(index=False))
    total = df["s, skipping"].sum() / df["s, every sample"].sum()
    cmd = f"python benchmarks/zero_advantage.py --run {args.run} --iterations {' '.join(map(str, args.iterations))}"
    section = Section(
        TITLE,
        f".venv/bin/{cmd} --write",
        rows,
        notes=[
            f"**Seconds skipping / seconds with every sample, over these updates: {total:.2f}**; the two measured"
            " one after the other in one process, on the same batch from the same starting weights.",
            f"Run `{Path(args.run).name}` (pipeline `{read_run_config(args.run)['pipeline']['name']}`); {machine()}.",
        ],
    )
    if args.write:
        write_section(ROOT / "benchmarks" / "README.md", f"## {TITLE}", section.markdown())


if __name__ == "__main__":
    main()
