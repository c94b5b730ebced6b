"""What every pipeline provides to the DAG: its agents, its problems, an episode runner, a rubric."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from infra.generation import Generation


@dataclass(frozen=True)
class AgentSpec:
    name: str           # agent id, also the adapter / checkpoint name
    role: str           # what the agent is for, as the coach is told
    system: int = 0     # 0 = single-system agent; 1 / 2 = MARS System 1 / System 2


@dataclass(frozen=True)
class Problem:
    task_id: str
    question: str
    answer: str


@dataclass
class Episode:
    """One finished episode: the `episodes` row fields and its actions (without run keys)."""

    problem: Problem
    episode_id: str
    group_id: str
    actions: list[dict] = field(default_factory=list)
    final_answer: str = ""
    success: bool = False
    outcome: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


# act(agent, chats) -> one Generation per chat (list of {"role", "content"} messages)
Act = Callable[[str, list[list[dict]]], list[Generation]]


class Pipeline(Protocol):
    name: str
    agents: list[AgentSpec]

    def problems(self, split: str) -> list[Problem]: ...

    def run_episodes(self, problems: list[Problem], episode_ids: list[str], group_ids: list[str],
                     act: Act) -> list[Episode]: ...

    def rubric(self, episode: Episode) -> list[tuple[float, str]]: ...

    def feedback(self, episode: Episode) -> list[str]: ...
