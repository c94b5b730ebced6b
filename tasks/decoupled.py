"""Decoupled gradients (MARS): each system's loss covers only the tokens it generated.

System 2's turns are stored one action row per turn, each prompt being the previous turn's prompt plus
its response plus the observation (tool output or System 1's extractions). `join_turns` rebuilds the
one trajectory sample System 2 yields per episode: the first prompt, then every turn's response and
the observation after it, with a loss mask of 1 on System 2's own tokens and 0 on the observations.
System 1's samples stay one per bin: its packed input is the prompt, its extraction the response.
"""

from __future__ import annotations

from dataclasses import dataclass


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
