"""PPO clipped surrogate and masked mean (tasks/losses.py) against hand-computed values."""

import math

import pytest
import torch

from tasks.losses import LOSSES, masked_mean, ppo_clip_loss


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert masked_mean(x, torch.tensor([[1.0, 0.0], [1.0, 1.0]])).item() == pytest.approx(8 / 3)  # (1 + 3 + 4) / 3
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0  # empty mask: 0, not NaN


# One token, old_logp = 0 and logp = log(ratio); eps = 0.2, so clip(ratio) is in [0.8, 1.2].
# objective = min(ratio*A, clip(ratio)*A); loss = -objective;
# d loss / d logp = -ratio*A when the unclipped term is the min, else 0 (clipped: no gradient).
@pytest.mark.parametrize(
    "ratio, adv, loss, grad",
    [
        (1.1, +1.0, -1.1, -1.1),  # inside the range: min(1.1, 1.1)
        (0.9, -1.0, +0.9, +0.9),  # inside the range: min(-0.9, -0.9)
        (1.5, +1.0, -1.2, 0.0),  # above, A > 0: min(1.5, 1.2) = 1.2, clipped
        (0.5, +1.0, -0.5, -0.5),  # below, A > 0: min(0.5, 0.8) = 0.5, unclipped (pessimistic bound)
        (1.5, -1.0, +1.5, +1.5),  # above, A < 0: min(-1.5, -1.2) = -1.5, unclipped
        (0.5, -1.0, +0.8, 0.0),  # below, A < 0: min(-0.5, -0.8) = -0.8, clipped
        (1.5, +2.0, -2.4, 0.0),  # scales with A: min(3.0, 2.4)
    ],
)
def test_ppo_clip_single_token(ratio, adv, loss, grad):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), clip_eps=0.2)
    out.backward()
    assert out.item() == pytest.approx(loss, rel=1e-6)
    assert logp.grad.item() == pytest.approx(grad, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_gradient_descent_moves_logp_with_the_advantage_sign(adv):
    logp = torch.zeros(1, 3, requires_grad=True)  # ratio 1 at the old policy
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 3), torch.full((1, 3), adv), torch.ones(1, 3))
    loss.backward()
    # d loss / d logp_l = -A / 3 (token mean): a descent step raises logp for A > 0 and lowers it for A < 0
    assert torch.allclose(logp.grad, torch.full((1, 3), -adv / 3))


def test_masked_tokens_ignored_in_loss_stats_and_gradient():
    # tokens: ratio 1.1 (A=1), ratio 1.5 (A=1), and a masked token with ratio e^3 and A=-5
    logp = torch.tensor([[math.log(1.1), math.log(1.5), 3.0]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, -5.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-(1.1 + 1.2) / 2)  # -(min(1.1,1.1) + min(1.5,1.2)) / 2
    assert logp.grad[0, 2].item() == 0.0
    assert logp.grad[0, 0].item() == pytest.approx(-1.1 / 2)  # unclipped token: -ratio*A / 2
    assert stats["clip_frac"] == pytest.approx(0.5)  # only the 1.5 token is outside [0.8, 1.2]
    assert stats["surrogate"] == pytest.approx((1.1 + 1.5) / 2)  # unclipped ratio*A mean
    assert stats["kl_old"] == pytest.approx(-(math.log(1.1) + math.log(1.5)) / 2, rel=1e-6)  # mean(old - logp)


def test_reference_kl_term_against_hand_values():
    """pi = 0.5 and pi_ref = 0.25 on one token, A = 0 (no policy term): k3 = exp(ref - logp) - (ref - logp) - 1
    = 0.5 - ln 0.5 - 1 = 0.19315; d/dlogp = 1 - exp(ref - logp) = 0.5; both times beta = 0.1. A masked
    token adds nothing."""
    from functools import partial

    from tasks.losses import with_reference_kl

    loss_fn = partial(with_reference_kl, base=partial(ppo_clip_loss, clip_eps=0.2), beta=0.1)
    logp = torch.tensor([[math.log(0.5), 0.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), -5.0]])
    out, stats = loss_fn(logp, logp.detach(), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), ref_logp=ref)
    out.backward()
    k3 = 0.5 - math.log(0.5) - 1
    assert stats["kl_ref"] == pytest.approx(k3, rel=1e-6)
    assert out.item() == pytest.approx(0.1 * k3, rel=1e-5)
    assert logp.grad[0, 0].item() == pytest.approx(0.1 * 0.5, rel=1e-5) and logp.grad[0, 1].item() == 0.0
    with pytest.raises(ValueError, match="without the reference pass"):
        loss_fn(logp, logp.detach(), torch.zeros(1, 2), torch.ones(1, 2))


def test_ppo_clip_is_advantage_weighted():
    """Every token term of PPO-clip is A times a function of the ratio: the trainer may skip A = 0 samples."""
    assert LOSSES["ppo_clip"] is ppo_clip_loss and LOSSES.traits("ppo_clip").advantage_weighted
