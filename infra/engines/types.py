"""What every engine speaks: a generation request and its results, and the two engine interfaces.

Plain dataclasses and Protocols (no torch import), so pipelines, tasks and the pure vLLM translation
can use them without pulling in an engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class Generation:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # of each response token under the sampling distribution, softmax(logits / T)
    text: str
    truncated: bool  # hit max_new_tokens without an end-of-turn token


@dataclass(frozen=True)
class GenerationRequest:
    """One batched generation by one agent: a response per prompt.

    `seed` seeds the sampling (the engine derives one seed per prompt from it, so duplicated prompts,
    e.g. a GRPO group, get different samples); `stop_ids` None = the tokenizer's end-of-sequence token;
    `stop_strings`: a response also ends once its text contains one of them (kept in the response).
    """

    agent: str
    prompts: list[list[int]]
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    seed: int = 0
    stop_ids: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()


class GenerationEngine(Protocol):
    """Serves every agent's policy (one LoRA adapter per agent on one base) for rollouts."""

    name: str

    def use(self, run_dir: str | Path, versions: dict[str, int]) -> None:
        """Serve each agent's weights at `versions` (its checkpoints in `run_dir`) from now on: the
        weight sync after an update."""

    def generate(self, request: GenerationRequest) -> list[Generation]:
        """One Generation per prompt, in order."""

    def sleep(self) -> None:
        """Free accelerator memory while the trainer runs (a no-op where that does not apply)."""

    def close(self) -> None:
        """Release everything the engine holds."""


class Trainer(Protocol):
    """Gradient updates of one agent's weights with a given loss function (tasks/losses.py)."""

    name: str

    def train(self, policy, agent: str, items: list, loss_fn: Callable, spec) -> tuple:
        """(TrainResult, optimizer state to save with the checkpoint, or None when the update was skipped)
        of `spec` (infra.trainer.TrainSpec): infra.trainer.train_loop over the engine's `Steps`."""
