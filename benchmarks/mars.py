"""MARS over training seeds (issue 22): does the research team learn, and what do System 1 and one shared
model change, on the `deepresearch-smol` preset.

    .venv/bin/python benchmarks/mars.py --variants shared --seeds 0 1     # run (resumable)
    .venv/bin/python benchmarks/mars.py --report --write                  # tables -> benchmarks/README.md

Variants: `shared` (the preset: one model plays System 2 and System 1, as in the paper), `separate` (one
adapter per system, `pipeline.shared_model=false`), `no-system1` (System 2 reads the raw search output
truncated to its budget, `pipeline.system1=false`), `g8` (the preset's 32 training episodes an iteration as 4
questions x 8 samples instead of 8 x 4), `short-docs` (documents of at most 200 tokens instead of 600), and
`short-docs-no-system1` and `short-docs-separate` (the two ablations on short documents), and `short-docs-names`
(training questions that ask for a name only) and `short-docs-names-em` (the same, rewarded by exact match);
the later ones (`short-docs-s1-coach`, `-kl`, `-positive`, `-positive-lr`,
`-positive-hops12`, `-positive-two-search`) are explained where `VARIANTS` defines them.
Each (variant, seed) is one `teamrl train` process with a fixed run id (`mars-<variant>-s<seed>` under
`--runs-dir`); a run whose folder exists is resumed, so killing this script loses at most the stage in
progress. When a run ends, its figures go to `benchmarks/mars/<variant>-s<seed>.csv` (per iteration) and
`.questions.csv` (every held-out question at every evaluation), one summary row to
`benchmarks/mars/runs.jsonl`; a run with a CSV is not run again.

The report (`--report`) is benchmarks/mars_report.py.

Per iteration: held-out exact match (greedy, 95% bootstrap interval over questions), F1, exact match by
answer kind (a year or a name) and by hops; on the training rollouts: exact match, F1, the share of GRPO
groups whose rewards differ (only those carry a gradient), searches per episode, repeated searches (the
same query again in one episode), purpose words per search, System-1 compression (raw tokens in per token
out), System 2's context tokens, and the update's seconds.

Per held-out question, where an answer is lost (`reading`): `retrieved`, the gold answer is in what a search
returned; `found`, it is in what System 2 read before its last reply (System 1's findings, or the truncated
raw text without System 1); `em`, System 2 then answered it. The report's funnel puts these side by side by
answer kind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.seeds import (  # noqa: E402
    cli,
    episode_table,
    eval_table,
    parser,
    run_and_record,
)
from pipelines.deepresearch.corpus import answer_kind  # noqa: E402
from pipelines.deepresearch.scoring import contains  # noqa: E402

OUT = ROOT / "benchmarks" / "mars"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## MARS over seeds (`benchmarks/mars.py`)"
VARIANTS = {
    "shared": [],
    "separate": ["pipeline.shared_model=false"],
    "no-system1": ["pipeline.system1=false"],
    # the same 32 training episodes an iteration as 4 questions x 8: a group more often holds both a success
    # and a failure (with success rate p, 1 - p^G - (1 - p)^G), and only such a group carries a gradient
    "g8": ["rollout.questions=4", "rollout.group_size=8"],
    # documents of 50-200 tokens, so one System-1 bin holds a whole document and System 2 reads one finding
    # a search instead of several, most of them another fact (often a year) or invented
    "short-docs": ["pipeline.max_tokens=200"],
    # the paper's two comparisons on short documents, where a run takes about half an hour
    "short-docs-no-system1": ["pipeline.max_tokens=200", "pipeline.system1=false"],
    "short-docs-separate": ["pipeline.max_tokens=200", "pipeline.shared_model=false"],
    # a curriculum: train on the questions that ask for a name only, so answering a year never earns a
    # reward (the held-out questions keep both kinds)
    "short-docs-names": ["pipeline.max_tokens=200", "pipeline.train_answers=[name]"],
    # the same with exact match as the reward: F1's partial credit for a sentence that holds the answer's name
    # taught short-docs-names to reply with whole sentences
    "short-docs-names-em": ["pipeline.max_tokens=200", "pipeline.train_answers=[name]", "pipeline.reward=em"],
    # a deviation from the paper: System 1's extractions credited by the rubric coach (did they pass on the
    # answer the bin held?) instead of the trajectory's reward, since System 1 dropping the answer is where
    # short-docs loses most name questions
    "short-docs-s1-coach": ["pipeline.max_tokens=200", "algorithm.system1_credit=coach", "coach.backend=rubric"],
    # a KL to the base model in the loss (DeepSeekMath's beta), against the drift of every answer to a year
    "short-docs-kl": ["pipeline.max_tokens=200", "algorithm.kl_loss_coef=0.04"],
    # only better-than-baseline actions trained, not the paper's way: failures outnumber successes 3 to 1,
    # and their push-down moved probability to years (benchmarks/update_direction.py)
    "short-docs-positive": ["pipeline.max_tokens=200", "algorithm.positive_only=true"],
    # the same at half the step: short-docs-positive's seed 2 swung from years to names in one update
    # (held-out exact match on year questions 0.65 -> 0.18 from iteration 4 to 6)
    "short-docs-positive-lr": ["pipeline.max_tokens=200", "algorithm.positive_only=true", "algorithm.lr=0.00025"],
    # the next step, a mix of 1- and 2-hop questions: a third System-2 turn makes room for a second
    # search (the first turn must search and the last must answer), so the search behaviour can change
    "short-docs-positive-hops12": [
        "pipeline.max_tokens=200",
        "algorithm.positive_only=true",
        "pipeline.hops=[1,2]",
        "pipeline.max_turns=3",
    ],
    # the same with a worked 2-hop episode that searches twice in System 2's prompt: with one-search examples
    # the team searched once in every episode of short-docs-positive-hops12, so no 2-hop answer was retrieved
    "short-docs-positive-two-search": [
        "pipeline.max_tokens=200",
        "algorithm.positive_only=true",
        "pipeline.hops=[1,2]",
        "pipeline.max_turns=3",
        "pipeline.two_search_example=true",
    ],
}
# the paper's comparisons, each (with, without) on the same seeds' held-out questions, and ours
CONTRASTS = [
    ("short-docs", "short-docs-no-system1"),
    ("short-docs", "short-docs-separate"),
    ("short-docs-s1-coach", "short-docs"),
    ("short-docs-kl", "short-docs"),
    ("short-docs-positive", "short-docs"),
    ("short-docs-positive-lr", "short-docs-positive"),
    ("short-docs-positive-two-search", "short-docs-positive-hops12"),
]


def episodes(run_dir: Path) -> pd.DataFrame:
    """The run's episodes with their metrics as columns, the answer's kind (year | name) and hop count."""
    from tasks import context

    eps = episode_table(run_dir)
    eps["kind"] = [answer_kind(str(a)) for a in eps["answer"]]
    hops = {p.task_id: p.hops for split in ("train", "eval") for p in context.of(run_dir).problems(split)}
    eps["hops"] = eps["task_id"].map(hops)
    return eps


def searches(run_dir: Path) -> pd.DataFrame:
    """One row per System-2 search: iteration, phase, episode, the query and the purpose's word count."""
    from infra import store
    from pipelines.deepresearch.prompts import PURPOSE_RE

    a = store.read_table(run_dir, "actions")
    a = a[(a["system"] == 2) & (a["tool_name"] == "search")]
    purpose = [(PURPOSE_RE.split(t, maxsplit=1)[1:] or [""])[0].split("\n")[0] for t in a["response_text"]]
    return pd.DataFrame(
        {
            "iteration": a["iteration"].to_numpy(),
            "phase": a["phase"].to_numpy(),
            "episode_id": a["episode_id"].to_numpy(),
            "query": [" ".join(str(q or "").lower().split()) for q in a["tool_input"]],
            "purpose_words": [len(p.split()) for p in purpose],
        },
        index=range(len(a)),
    )


def answer_flags(answer: str, tool_names: list, tool_outputs: list, last_prompt: str) -> dict[str, int]:
    """`retrieved`: `answer` is in some search's raw output; `found`: it is in what System 2 read after the
    episode's question (the last "Question:" of its last prompt; the question's own line is skipped) before
    its last reply."""
    # a turn without a tool (an answer before the last turn) has NA for both, which `==` cannot test
    raw = "\n".join(
        o for t, o in zip(tool_names, tool_outputs) if isinstance(t, str) and t == "search" and isinstance(o, str)
    )
    read = last_prompt.rsplit("Question:", 1)[-1].split("\n", 1)[-1]
    return {"retrieved": int(contains(raw, answer)), "found": int(contains(read, answer))}


def reading(run_dir: Path) -> pd.DataFrame:
    """`answer_flags` per episode (index: iteration, phase, episode_id), from its System-2 actions."""
    from infra import store

    a = store.read_table(run_dir, "actions")
    a = a[a["system"] == 2].sort_values("turn")
    gold = store.read_table(run_dir, "episodes").set_index(["iteration", "phase", "episode_id"])["answer"]
    rows = {
        key: answer_flags(
            str(gold.get(key, "")), list(g["tool_name"]), list(g["tool_output"]), str(g["prompt_text"].iloc[-1])
        )
        for key, g in a.groupby(["iteration", "phase", "episode_id"], sort=False)
    }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.names = ["iteration", "phase", "episode_id"]
    return out


def per_iteration(run_dir: Path) -> pd.DataFrame:
    """One row per iteration: held-out figures where an evaluation ran (iteration 0: the untrained team),
    training-rollout figures where one ran."""
    from infra import store

    ev_table = eval_table(run_dir)
    eps, s = episodes(run_dir), searches(run_dir)
    up = store.read_table(run_dir, "updates")
    rows = []
    for it in sorted(eps["iteration"].unique()):
        ev = eps[(eps["iteration"] == it) & (eps["phase"] == "eval") & (eps["greedy"] == 1.0)]
        ro = eps[(eps["iteration"] == it) & (eps["phase"] == "rollout")]
        row: dict = {"iteration": int(it)}
        if len(ev):
            row |= {
                "heldout_em": ev["em"].mean(),
                "heldout_ci_low": ev_table["success_ci_low"].get(it, np.nan),
                "heldout_ci_high": ev_table["success_ci_high"].get(it, np.nan),
                "heldout_f1": ev["f1"].mean(),
                **{f"heldout_em_{k}": g["em"].mean() for k, g in ev.groupby("kind")},
                **{f"heldout_em_{h}hop": g["em"].mean() for h, g in ev.groupby("hops")},
            }
        if len(ro):
            rs = s[(s["iteration"] == it) & (s["phase"] == "rollout")]
            repeats = len(rs) - len(rs.drop_duplicates(["episode_id", "query"]))
            u = up[up["iteration"] == it]
            row |= {
                "train_em": ro["em"].mean(),
                "train_f1": ro["f1"].mean(),
                "groups_with_signal": ro.groupby("group_id")["outcome"].std(ddof=0).gt(0).mean(),
                "searches_per_episode": ro["tool_calls"].mean(),
                "repeated_searches_per_episode": repeats / len(ro),
                "purpose_words": rs["purpose_words"].mean() if len(rs) else np.nan,
                "s1_compression": ro["s1_tokens_in"].sum() / max(ro["s1_tokens_out"].sum(), 1.0),
                "s2_context_tokens": ro["s2_context_tokens"].mean(),
                "update_s": u["seconds"].sum(),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def questions(run_dir: Path) -> pd.DataFrame:
    """Every greedy held-out episode: iteration, task_id, kind, hops, em, f1, retrieved, found (`reading`),
    year_reply (System 2's answer is a year, whatever the question asked)."""
    eps = episodes(run_dir)
    ev = eps[(eps["phase"] == "eval") & (eps["greedy"] == 1.0)]
    ev = ev.join(reading(run_dir), on=["iteration", "phase", "episode_id"])
    ev["year_reply"] = [float(answer_kind(str(a or "")) == "year") for a in ev["final_answer"]]
    cols = ["iteration", "task_id", "kind", "hops", "em", "f1", "retrieved", "found", "year_reply"]
    return ev[cols].sort_values(["iteration", "task_id"])


def run(variant: str, seed: int, args: argparse.Namespace) -> None:
    def write(run_dir: Path) -> None:
        questions(run_dir).to_csv(OUT / f"{variant}-s{seed}.questions.csv", index=False, float_format="%.6g")
        per_iteration(run_dir).to_csv(OUT / f"{variant}-s{seed}.csv", index=False, float_format="%.6g")

    run_and_record(OUT, args, variant, seed, f"mars-{variant}-s{seed}", VARIANTS[variant], write)


def main() -> None:
    ap = parser(
        __doc__,
        preset="deepresearch-smol",
        variants=list(VARIANTS),
        default=["shared"],
        seeds=[0, 1],
        iterations=6,
        eval_every=2,
        runs_dir=ROOT / "runs" / "mars",
    )
    from benchmarks.mars_report import report

    cli(ap, OUT, README, SECTION, report, run)


if __name__ == "__main__":
    main()
