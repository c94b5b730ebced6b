"""How a team acts inside a pipeline's episodes: the `Act` the pipeline calls, one batched generation per
agent and turn, in the `collect_rollouts` task or in a Ray rollout actor (infra/engines/ray_rollouts.py)."""

from __future__ import annotations

from functools import cache

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.generation import GenerationRequest, encode_chat


class TeamActs:
    """The pipeline's `Act`: batched generation per agent (the generation engine), the tokenizer, and the
    pipeline's own stages; `advance` ticks a progress bar per call, `seed_of(agent, n)` seeds the n-th call."""

    def __init__(self, engine, tokenizer, pipe, temperature, greedy, advance, seed_of, in_flow: bool = True):
        self.engine, self.tokenizer, self.pipe = engine, tokenizer, pipe
        self.temperature, self.greedy, self.advance, self.seed_of = temperature, greedy, advance, seed_of
        self.in_flow = in_flow  # False in a Ray actor: a pipeline's stage runs as a plain function there
        self.calls = 0  # an agent may act on several turns: each call gets its own seed

    def __call__(self, agent: str, prompts: list) -> list:
        self.calls += 1
        ids = [p if p and isinstance(p[0], int) else encode_chat(self.tokenizer, p) for p in prompts]
        cfg = self.pipe.cfg  # a pipeline's budget per agent
        out = self.engine.generate(
            GenerationRequest(
                agent,
                ids,
                cfg.max_new_tokens.get(agent, 64),
                temperature=self.temperature,
                greedy=self.greedy,
                seed=self.seed_of(agent, self.calls),
                stop_strings=self.pipe.stop(agent),
            )
        )
        self.advance()
        return out

    def stage(self, name: str, fn, *args):
        return as_task(name, fn)(*args) if self.in_flow else fn(*args)


@cache
def as_task(name: str, fn):
    """`fn` as the Prefect task `name`, one per (name, function): a pipeline's stage inside collect_rollouts.
    Not cached (its inputs are live objects) and its result not persisted: the rollout's tables are."""
    return task(name=name, cache_policy=NO_CACHE, persist_result=False)(fn)
