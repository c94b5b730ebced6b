"""TeamTR's trust region (tasks/trust_region.py) against hand-computed values, the update order / resample hook,
and the backtracking line search on the tiny model."""

import math
from functools import partial

import pytest
import torch

from flows.config import load_config
from flows.train import update_order, update_phase
from infra.engines.torch import train_agent
from infra.models import ModelConfig
from infra.policy import TeamPolicy
from infra.trainer import TrainItem, TrainSpec, batch_logprobs
from tasks.losses import ppo_clip_loss
from tasks.trust_region import kl_tok
from tasks.update import enforce_trust_region

NEW = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]])
OLD = torch.tensor([[math.log(0.25), math.log(0.4), -5.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: never counted


def test_kl_tok_is_the_k3_token_mean():
    # r = 2 and 0.5: (2 - 1 - ln 2 + 0.5 - 1 - ln 0.5) / 2 = 0.25
    assert kl_tok(NEW, OLD, MASK) == pytest.approx(0.25)
    assert kl_tok(OLD, OLD, MASK) == 0.0


def test_update_phase_is_the_resample_hook():
    assert [update_phase("joint", i) for i in range(3)] == ["rollout"] * 3
    assert [update_phase("stale", i) for i in range(3)] == ["rollout"] * 3
    assert [update_phase("teamtr", i) for i in range(3)] == ["rollout", "resample-1", "resample-2"]


def test_update_order():
    agents = ["a", "b", "c", "d"]
    assert update_order(agents, "fixed", 0, 1) == agents
    orders = [update_order(agents, "random", 0, k) for k in range(1, 9)]
    assert all(sorted(o) == agents for o in orders) and len({tuple(o) for o in orders}) > 1
    assert orders == [update_order(agents, "random", 0, k) for k in range(1, 9)]  # a resume replays it


def test_teamtr_without_a_trust_region_is_a_warned_ablation():
    with pytest.warns(UserWarning, match="ablation without TeamTR's trust region"):
        assert load_config("tiny", ["algorithm.strategy=teamtr", "algorithm.kl_delta=null"]).algorithm.kl_delta is None
    assert load_config("tiny", ["algorithm.strategy=teamtr", "algorithm.kl_delta=0.05"]).algorithm.kl_delta == 0.05


@pytest.fixture(scope="module")
def policy():
    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a"], seed=0)


def _batch(policy):
    """Sampled-looking items whose old log-probs are the policy's own (so KL starts at 0)."""
    g = torch.Generator().manual_seed(1)
    items = [
        TrainItem(
            torch.randint(10, 1000, (6,), generator=g).tolist(),
            torch.randint(10, 1000, (4,), generator=g).tolist(),
            [0.0] * 4,
            torch.randn(4, generator=g).tolist(),
            [1] * 4,
        )
        for _ in range(4)
    ]
    new, *_ = batch_logprobs(policy, "a", items)
    for it, lp in zip(items, new):
        it.old_logprobs = lp[:4].tolist()
    return items


def _train(policy, items, lr):
    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))
    start = [p.detach().clone() for p in policy.parameters("a")]
    train_agent(
        policy,
        "a",
        items,
        partial(ppo_clip_loss, clip_eps=10.0),
        TrainSpec(lr=lr, weight_decay=0.0, epochs=3, minibatch_size=4, max_grad_norm=1e9, seed=0),
    )
    return start


def test_backtracking_brings_the_kl_within_delta(policy):
    items = _batch(policy)
    start = _train(policy, items, lr=0.05)
    new, old, _, mask = batch_logprobs(policy, "a", items)
    trained = kl_tok(new, old, mask)
    delta = trained / 10
    kl, kept = enforce_trust_region(policy, "a", items, start, delta, steps=10, temperature=1.0, micro_batch_size=2)
    assert 0 < kept < 1 and kl <= delta < trained


def test_no_step_within_delta_restores_the_weights(policy):
    items = _batch(policy)
    start = _train(policy, items, lr=0.05)
    kl, kept = enforce_trust_region(policy, "a", items, start, 1e-12, steps=1, temperature=1.0, micro_batch_size=2)
    assert kept == 0.0 and kl > 1e-12
    for a, b in zip(start, policy.parameters("a")):
        assert torch.equal(a, b)
