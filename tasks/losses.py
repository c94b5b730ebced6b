"""Policy-gradient losses as pure functions over padded [B, L] tensors with a 0/1 token mask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from infra.plugins import Registry


@dataclass(frozen=True)
class LossTraits:
    """What the trainer knows of a loss without calling it, declared where it is registered
    (`@LOSSES.register("name", advantage_weighted=True)`)."""

    # every token term is A times a function of the ratio: a sample with A = 0 on each trained token has a
    # zero gradient, so the trainer skips its forward pass (GRPO groups whose trajectories all scored the
    # same). False by default, since a loss with a term of its own (an entropy bonus, a KL to a reference)
    # would lose that term's gradient on the skipped samples.
    advantage_weighted: bool = False


# algorithm.loss -> loss(logp, old_logp, adv, mask, clip_eps) -> (loss, stats); every [B, L] tensor padded
LOSSES: Registry[Callable[..., tuple[torch.Tensor, dict[str, float]]], LossTraits] = Registry("loss", LossTraits)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * m) / max(sum(m), 1); masked positions never contribute, even when non-finite."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def k3(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per token (r - 1) - log r, r = exp(logp - old_logp): the k3 estimate of KL(old || new), >= 0."""
    log_r = logp - old_logp
    return torch.expm1(log_r) - log_r


@LOSSES.register("ppo_clip", advantage_weighted=True)
def ppo_clip_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_eps: float = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    """L = -token_mean(min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)), rho = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean(((ratio - 1).abs() > clip_eps).float(), mask).item(),
            "kl_old": masked_mean(old_logp - logp, mask).item(),  # k1 estimate of KL(old || new)
            "kl": masked_mean(k3(logp, old_logp), mask).item(),
            "surrogate": masked_mean(unclipped, mask).item(),
        }
    return loss, stats


def with_reference_kl(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    *,
    base: Callable,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """L = base + beta * token_mean(exp(ref - logp) - (ref - logp) - 1): GRPO's KL to the reference in the
    loss (DeepSeekMath's k3 estimate of KL(pi || pi_ref)), for estimators with no KL in the reward."""
    if ref_logp is None:
        raise ValueError(
            "algorithm.kl_loss_coef > 0 needs the reference log-probs of every trained sample: these "
            "rollouts were collected without the reference pass"
        )
    loss, stats = base(logp, old_logp, adv, mask)
    kl = masked_mean(k3(ref_logp, logp), mask)
    return loss + beta * kl, stats | {"kl_ref": kl.item()}
