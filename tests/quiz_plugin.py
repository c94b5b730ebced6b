"""A pipeline from outside the package, as docs/guides/extending.md describes it: one agent answers sums.
tests/test_extending.py names this module in a run's `plugins`, which registers it."""

from __future__ import annotations

import json
import random
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import UsageError
from pipelines import PIPELINES
from pipelines.base import Act, AgentSpec, Episode, PipelineBase, Problem, action_row, own_weights


class QuizConfig(BaseModel):
    """The quiz team and its problems."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["quiz"] = "quiz"
    train_size: int = Field(32, ge=1, description="training problems")
    eval_size: int = Field(4, ge=1, description="held-out problems")
    max_new_tokens: dict[str, int] = Field(default_factory=lambda: {"answerer": 8}, description="token budget")


def _answer(text: str) -> str | None:
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


@PIPELINES.register("quiz")
class Quiz(PipelineBase):
    name = "quiz"
    Config = QuizConfig
    agents = [AgentSpec("answerer", "Answerer: states the sum as an integer")]
    weights = own_weights(agents)

    def __init__(self, cfg: QuizConfig, seed: int):
        self.cfg, self.seed = cfg, seed

    def problems(self, split: str) -> list[Problem]:
        r = random.Random(self.seed + (split == "eval"))
        n = self.cfg.eval_size if split == "eval" else self.cfg.train_size
        pairs = [(r.randint(1, 9), r.randint(1, 9)) for _ in range(n)]
        return [Problem(f"{split}-{i}", f"What is {a} + {b}?", str(a + b)) for i, (a, b) in enumerate(pairs)]

    def load_problems(self, path: str, docs: str | None = None) -> list[Problem]:
        if docs:
            raise UsageError("the quiz pipeline takes no documents file")
        lines = open(path).read().splitlines()
        return [Problem(f"user-{i}", r["question"], str(r["answer"])) for i, r in enumerate(map(json.loads, lines))]

    def run_episodes(
        self, problems: list[Problem], episode_ids: list[str], group_ids: list[str], act: Act
    ) -> list[Episode]:
        eps = [Episode(problem=p, episode_id=e, group_id=g) for p, e, g in zip(problems, episode_ids, group_ids)]
        replies = act("answerer", [[{"role": "user", "content": e.problem.question}] for e in eps])
        for e, g in zip(eps, replies):
            e.actions.append(action_row(0, "answerer", g))
            e.final_answer = _answer(g.text) or ""
            e.success = e.final_answer == e.problem.answer
            e.outcome = float(e.success)
        return eps

    def rubric(self, episode: Episode, ground_truth: bool) -> list[tuple[float | None, str]]:
        if episode.success:
            return [(10.0, "the right sum")]
        return [(3.0, "an integer, not the sum") if episode.final_answer else (0.0, "no integer")]

    def feedback(self, episode: Episode, ground_truth: bool) -> list[str]:
        told = f"; the sum is {episode.problem.answer}" if ground_truth else ""
        return [f"The answer given: {episode.final_answer or 'none'}{told}"]
