"""What the `llm` coach costs per training iteration: its calls and prompt tokens, on a stored run.

    .venv/bin/python benchmarks/coach_load.py --run runs/RUN [--write]

For every training partition (`rollout`, and TeamTR's `resample-*`) of every iteration of the run, it
builds the exact chats `coach_evaluate` would send with `coach.backend=llm` (tasks/coach.py
`coach_messages`, with the worked example when `coach.few_shot`), with and without the answer
(`coach.ground_truth`), and counts them: one call per action, prompt tokens through the chat template
of SmolLM2-135M-Instruct's tokenizer (the model the project ships; an 8B model's tokenizer splits English
into somewhat fewer tokens, so read the counts as an upper estimate). A reply is at most
`coach.max_tokens`; a malformed one is re-asked up to `coach.reask` times, which adds calls. No
server is called. `--write` puts the table in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_section  # noqa: E402

README = ROOT / "benchmarks" / "README.md"
SECTION = "## What the LLM coach costs per iteration (`benchmarks/coach_load.py`)"


def load(run_dir: str) -> pd.DataFrame:
    """One row per (iteration, phase, ground_truth): coach calls and prompt tokens (mean, max, sum)."""
    from transformers import AutoTokenizer

    from infra import store
    from infra.models import smollm2_dir
    from tasks.coach import coach_messages
    from tasks.coach_evaluate import coach_requests, load_partition_episodes
    from tasks.context import RunContext

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    ctx = RunContext(run_dir)
    pipe, cfg = ctx.pipeline, ctx.config.coach
    eps = store.read_table(run_dir, "episodes")
    parts = eps[(eps["phase"] == "rollout") | eps["phase"].str.startswith("resample")][["iteration", "phase"]]
    rows = []
    for it, phase in sorted(set(map(tuple, parts.to_numpy())), key=lambda x: (x[0], x[1] != "rollout", x[1])):
        episodes = [e for e in load_partition_episodes(run_dir, int(it), phase) if not e.infra_error]
        for gt in (True, False):
            c = cfg.model_copy(update={"backend": "llm", "ground_truth": gt})
            chats = [coach_messages(c, r) for r in coach_requests(pipe, episodes, gt)]
            ids = [tok.apply_chat_template(m, add_generation_prompt=True, return_dict=True)["input_ids"] for m in chats]
            n = list(map(len, ids))
            rows.append(
                {
                    "iteration": int(it),
                    "phase": phase,
                    "ground_truth": gt,
                    "calls": len(n),
                    "prompt_tokens_mean": float(np.mean(n)),
                    "prompt_tokens_max": int(max(n)),
                    "prompt_tokens": int(sum(n)),
                }
            )
    return pd.DataFrame(rows)


def table(df: pd.DataFrame, run: str, cfg) -> list[str]:
    df = df.assign(partitions=np.where(df["phase"] == "rollout", "rollout", "TeamTR's resamples"))
    lines = [
        f"Run `{run}` ({df['iteration'].nunique()} iterations). Per iteration, by partition; prompt tokens through "
        f"SmolLM2's chat template; replies at most `coach.max_tokens` = {cfg.max_tokens} tokens each (plus "
        "re-asks of malformed replies). `joint` (MAPPA) has the rollout partition only.",
        "",
        "| coach sees the answer | partitions | calls / iteration | prompt tokens / call (mean, max) "
        "| prompt tokens / iteration | reply tokens / iteration (at most) |",
        "|---|---|---|---|---|---|",
    ]
    for (gt, kind), d in df.groupby(["ground_truth", "partitions"], sort=False):
        per_it = d.groupby("iteration")[["calls", "prompt_tokens"]].sum().mean()
        lines.append(
            f"| {'yes' if gt else 'no'} | {kind} | {per_it['calls']:.0f} | "
            f"{d['prompt_tokens'].sum() / d['calls'].sum():.0f}, {d['prompt_tokens_max'].max()} | "
            f"{per_it['prompt_tokens']:,.0f} | {per_it['calls'] * cfg.max_tokens:,.0f} |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a run folder")
    p.add_argument("--write", action="store_true", help="replace the section in benchmarks/README.md")
    args = p.parse_args()
    from tasks.context import RunContext

    df = load(args.run)
    cfg = RunContext(args.run).config.coach
    cmd = f"`.venv/bin/python benchmarks/coach_load.py --run {args.run} --write`"
    body = "\n".join([SECTION, "", *table(df, Path(args.run).name, cfg), "", f"Reproduce: {cmd}"])
    print(body)
    if args.write:
        write_section(README, SECTION, body)


if __name__ == "__main__":
    main()
