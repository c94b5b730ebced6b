"""TeamTR's per-update trust region: the token-level KL of an update on its batch.

The expectation is a token mean over the agent's update batch, sampled from pi_cur (the agent before
the update) on the occupancy the batch was collected on. Turn-taking makes the team's KL the acting
agent's KL on visited states, so sampled log-probs suffice (no vocabulary sum). The certificate the
update earns is tasks/certificate.py's.
"""

from __future__ import annotations

import torch

from tasks.losses import k3, masked_mean


def kl_tok(new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """D_tok(pi_cur || pi_new) ~= token_mean((r - 1) - log r), r = exp(new - old): unbiased, >= 0 (k3)."""
    return masked_mean(k3(new_logp, old_logp), mask).item()
