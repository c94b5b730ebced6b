"""The torch trainer: micro-batching changes memory, not the update; non-finite steps are refused."""

from functools import partial

import pytest
import torch
from conftest import train_items

from infra.models import ModelConfig
from infra.policy import TeamPolicy
from infra.trainer import TrainItem, TrainSpec, batch_logprobs, by_prompt, train_agent
from tasks.losses import ppo_clip_loss


@pytest.fixture(scope="module")
def policy():
    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a"], seed=0)


def _gradient(policy, items, micro):
    """One minibatch step with lr = 0: the weights stay put and .grad holds the minibatch gradient."""
    for p in policy.parameters("a"):  # the same adapter weights for every call
        torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))
    res, _ = train_agent(
        policy,
        "a",
        items,
        partial(ppo_clip_loss, clip_eps=0.2),
        TrainSpec(
            lr=0.0,
            weight_decay=0.0,
            epochs=1,
            minibatch_size=len(items),
            max_grad_norm=1e9,
            seed=0,
            micro_batch_size=micro,
        ),
    )
    return res, [p.grad.detach().clone() for p in policy.parameters("a")]


def test_micro_batches_give_the_minibatch_gradient(policy):
    items = train_items()
    res_full, full = _gradient(policy, items, micro=len(items))
    res_micro, micro = _gradient(policy, items, micro=1)
    assert res_full.tokens == res_micro.tokens == sum(len(it.response_ids) for it in items)
    assert res_full.loss == pytest.approx(res_micro.loss, rel=1e-4)
    assert sum(g.abs().sum() for g in full) > 0
    for a, b in zip(full, micro):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_a_group_shares_its_prompt_forward_and_gets_the_same_gradient(policy):
    """G samples of one prompt: micro-batches put them together (by_prompt) and response_logits runs the
    prompt once for them; the minibatch gradient equals scoring each sample on its own."""
    base = train_items()
    items = [
        TrainItem(base[i % 2].prompt_ids, it.response_ids, it.old_logprobs, it.advantages, it.mask)
        for i, it in enumerate(base)
    ]  # two groups of three, interleaved
    assert [it.prompt_ids for it in by_prompt(items)] == [base[0].prompt_ids] * 3 + [base[1].prompt_ids] * 3
    res_one, one = _gradient(policy, items, micro=1)
    res_shared, shared = _gradient(policy, items, micro=3)
    assert res_one.loss == pytest.approx(res_shared.loss, rel=1e-4)
    for a, b in zip(one, shared):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_batch_logprobs_keep_the_items_order_when_prompts_are_grouped(policy):
    base = train_items(4)
    items = [
        TrainItem(base[i % 2].prompt_ids, it.response_ids, it.old_logprobs, it.advantages, it.mask)
        for i, it in enumerate(base)
    ]  # prompts A B A B: scored as A A, B B
    new, old, adv, mask = batch_logprobs(policy, "a", items, micro_batch_size=2)
    for row, it in zip(range(4), items):
        alone, *_ = batch_logprobs(policy, "a", [it])
        n = len(it.response_ids)
        torch.testing.assert_close(new[row, :n], alone[0, :n], atol=1e-5, rtol=0)
        assert adv[row, :n].tolist() == pytest.approx(it.advantages) and mask[row, :n].sum() == n


def test_non_finite_loss_skips_and_restores(policy):
    items = train_items(2)

    def nan_loss(logp, old, adv, mask):
        return (logp * float("nan")).sum(), {}

    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02)
    before = [p.detach().clone() for p in policy.parameters("a")]
    res, state = train_agent(
        policy,
        "a",
        items,
        nan_loss,
        TrainSpec(lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=2, max_grad_norm=1.0, seed=0),
    )
    assert res.skipped and state is None and "non-finite" in res.reason
    for a, b in zip(before, policy.parameters("a")):
        assert torch.equal(a, b)
