"""The `torch` trainer: plain PyTorch + AdamW on the team's model (infra/trainer.py's train_loop over TorchSteps,
or over FSDP2's ShardedSteps of infra/sharded.py)."""

from __future__ import annotations

from collections.abc import Callable

from infra.sharded import ShardedSteps
from infra.trainer import TorchSteps, TrainItem, TrainResult, TrainSpec, train_loop


class TorchTrainer:
    name = "torch"

    def __init__(self, engines=None):
        self.engines = engines

    def train(self, policy, agent, items, loss_fn, spec):
        return train_agent(policy, agent, items, loss_fn, spec)


def train_agent(
    policy, agent: str, items: list[TrainItem], loss_fn: Callable, spec: TrainSpec
) -> tuple[TrainResult, dict | None]:
    """The `torch` engine's update of `agent` on `items`: train_loop over TorchSteps, or over FSDP2's
    ShardedSteps for full weights on several ranks."""
    steps = ShardedSteps if spec.world > 1 and policy.cfg.weights == "full" else TorchSteps
    return train_loop(steps(policy, agent, spec), items, loss_fn, spec)
