"""TeamTR's per-update trust region and improvement certificate, as pure functions of token tensors.

All expectations are token means over the agent's update batch, sampled from pi_cur (the agent
before the update) on the occupancy the batch was collected on: the stage-start rollouts (`stale`,
`joint`) or a resample with the partially updated team (`teamtr`). Turn-taking makes the team's KL
the acting agent's KL on visited states, so sampled log-probs suffice (no vocabulary sum).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tasks.losses import k3, masked_mean


def kl_tok(new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """D_tok(pi_cur || pi_new) ~= token_mean((r - 1) - log r), r = exp(new - old): unbiased, >= 0 (k3)."""
    return masked_mean(k3(new_logp, old_logp), mask).item()


def surrogate_gain(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> float:
    """L = token_mean((r - 1) * A): the improvement the update predicts on this batch's occupancy."""
    return masked_mean(torch.expm1(new_logp - old_logp) * adv, mask).item()


def penalty(max_abs_adv: float, kl: float) -> float:
    """P = 2 * max|A| * sqrt(KL / 2): Pinsker's bound on how far the expected advantage can move."""
    return 2.0 * max_abs_adv * math.sqrt(max(kl, 0.0) / 2.0)


@dataclass
class Certificate:
    kl: float
    gain: float
    penalty: float

    @property
    def value(self) -> float:
        """certificate = gain - penalty: a lower bound on the update's improvement (Theorem 3.4's form)."""
        return self.gain - self.penalty


def certify(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> Certificate:
    kl = kl_tok(new_logp, old_logp, mask)
    max_abs = torch.where(mask > 0, adv.abs(), torch.zeros_like(adv)).max().item() if mask.any() else 0.0
    return Certificate(kl, surrogate_gain(new_logp, old_logp, adv, mask), penalty(max_abs, kl))
