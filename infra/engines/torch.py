"""The `torch` trainer: plain PyTorch + AdamW on the team's model (infra/trainer.py's train_loop over TorchSteps)."""

from __future__ import annotations

from infra.trainer import train_agent


class TorchTrainer:
    name = "torch"

    def __init__(self, engines=None):
        self.engines = engines

    def train(self, policy, agent, items, loss_fn, spec):
        return train_agent(policy, agent, items, loss_fn, spec)
