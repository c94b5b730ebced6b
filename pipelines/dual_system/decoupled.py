"""Decoupled gradients (MARS): each system's loss covers only the tokens it generated.

System 2's turns are stored one action row per turn, each prompt being the previous turn's prompt plus
its response plus the observation (tool output or System 1's extractions). `join_turns` rebuilds the
one trajectory sample System 2 yields per episode: the first prompt, then every turn's response and
the observation after it, with a loss mask of 1 on System 2's own tokens and 0 on the observations.
System 1's samples stay one per bin: its packed input is the prompt, its extraction the response.
`train_items` builds a weights unit's update batch from both.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.trainer import TrainItem
from pipelines.base import ref_of, row_items


@dataclass
class Turn:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    advantages: list[float]
    loss_mask: list[int]
    ref_logprobs: list[float] | None = None  # None where no reference pass ran


def join_turns(turns: list[Turn]) -> Turn:
    """One sample: prompt = the first turn's prompt; response = r_1 o_1 r_2 o_2 ... r_T where o_t is
    what turn t+1's prompt adds after r_t; mask (and advantages, log-probs, reference log-probs) are 0 on
    every o_t."""
    if not turns:
        raise ValueError("no turns to join")
    head = list(turns[0].prompt_ids)
    refs: list[float] | None = None if any(t.ref_logprobs is None for t in turns) else []
    out = Turn(head, [], [], [], [], refs)
    for k, t in enumerate(turns):
        seq = head + out.response_ids
        if list(t.prompt_ids[: len(seq)]) != seq:
            raise ValueError(
                f"turn {k}'s prompt does not extend the trajectory so far: System-2 contexts must "
                "be built with infra.generation.continue_chat"
            )
        obs = list(t.prompt_ids[len(seq) :])
        out.response_ids += obs + list(t.response_ids)
        out.logprobs += [0.0] * len(obs) + list(t.logprobs)
        out.advantages += [0.0] * len(obs) + list(t.advantages)
        out.loss_mask += [0] * len(obs) + list(t.loss_mask)
        if out.ref_logprobs is not None:
            out.ref_logprobs += [0.0] * len(obs) + list(t.ref_logprobs or [])
    return out


def train_items(df, reference: bool = False) -> list[TrainItem]:
    """The update batch of one weights unit from its roles' action rows: System 2's turns give one
    trajectory sample per episode (observations masked, `join_turns`), every other row (System 1) its own
    sample `weight` times (the duplication count of balanced sampling). A shared MARS model gets both parts
    in one batch, so one token-mean loss covers both systems. `reference`: the items carry the rows'
    reference log-probs, for a loss with a KL term to the reference."""
    df = df[df["weight"].fillna(0) > 0]
    s2, rest = df[df["system"] == 2], df[df["system"] != 2]
    turns = [
        [
            Turn(
                r["prompt_ids"], r["response_ids"], r["logprobs"], r["advantages"], r["loss_mask"], ref_of(r, reference)
            )
            for r in g.sort_values("turn").to_dict("records")
        ]
        for _, g in s2.groupby("episode_id", sort=True)
    ]
    items = [
        TrainItem(t.prompt_ids, t.response_ids, t.logprobs, t.advantages, t.loss_mask, t.ref_logprobs)
        for t in map(join_turns, turns)
    ]
    return items + row_items(rest, reference)
