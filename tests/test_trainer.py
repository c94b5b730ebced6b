"""The torch trainer: micro-batching changes memory, not the update; non-finite steps are refused."""

from dataclasses import replace
from functools import partial

import pytest
import torch
from conftest import train_items

from infra.engines.torch import train_agent
from infra.generation import response_logprobs
from infra.models import ModelConfig
from infra.policy import TeamPolicy
from infra.trainer import TrainItem, TrainSpec, batch_logprobs, by_prompt
from tasks.losses import ppo_clip_loss


@pytest.fixture(scope="module")
def policy():
    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a"], seed=0)


def _gradient(policy, items, micro, skip_zero=False):
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
            skip_zero_advantage=skip_zero,
        ),
    )
    return res, [p.grad.detach().clone() for p in policy.parameters("a")]


@pytest.fixture
def forwarded(monkeypatch):
    """The number of samples each trainer forward pass scores, in call order."""
    import infra.trainer

    calls: list[int] = []

    def counted(model, prompts, *args, **kwargs):
        calls.append(len(prompts))
        return response_logprobs(model, prompts, *args, **kwargs)

    monkeypatch.setattr(infra.trainer, "response_logprobs", counted)
    return calls


def _zeroed(items, which):
    """`items` with the advantages of those at indices `which` set to 0 (a GRPO group that all scored alike)."""
    return [replace(it, advantages=[0.0] * len(it.advantages)) if i in which else it for i, it in enumerate(items)]


def test_zero_advantage_samples_skip_their_forward_and_keep_the_gradient(policy, forwarded):
    items = _zeroed(train_items(), {0, 2, 3})
    res_all, full = _gradient(policy, items, micro=2)
    assert sum(forwarded) == 6
    forwarded.clear()
    res_skip, skipped = _gradient(policy, items, micro=2, skip_zero=True)
    assert sum(forwarded) == 3  # the three samples with a non-zero advantage
    assert res_skip.tokens == res_all.tokens  # the skipped samples' tokens still weigh in the token mean
    assert res_skip.loss == pytest.approx(res_all.loss, rel=1e-5)
    assert sum(g.abs().sum() for g in full) > 0
    for a, b in zip(full, skipped):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_a_minibatch_of_zero_advantages_still_steps_the_optimizer_as_before(policy, forwarded, tmp_path):
    """AdamW moves the weights on zero gradients (its momentum): with every sample skippable, one
    micro-batch still runs, so the weights end where they would have without skipping."""
    loss = partial(ppo_clip_loss, clip_eps=0.2)
    spec = TrainSpec(lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=6, max_grad_norm=1.0, seed=0)
    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))
    _, state = train_agent(policy, "a", train_items(), loss, spec)  # momentum for the next update
    torch.save(state, tmp_path / "optimizer.pt")
    moved = [p.detach().clone() for p in policy.parameters("a")]
    ends = []
    for skip in (False, True):
        with torch.no_grad():
            for p, m in zip(policy.parameters("a"), moved):
                p.copy_(m)
        forwarded.clear()
        zero = replace(spec, optimizer_state=tmp_path / "optimizer.pt", skip_zero_advantage=skip)
        train_agent(policy, "a", _zeroed(train_items(), set(range(6))), loss, zero)
        assert sum(forwarded) == (2 if skip else 6)  # one micro-batch of micro_batch_size 2
        ends.append([p.detach().clone() for p in policy.parameters("a")])
    for a, b in zip(*ends):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    assert any(not torch.equal(a, m) for a, m in zip(ends[1], moved))


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


def test_after_an_update_that_never_saved_load_reads_the_checkpoint(policy, tmp_path):
    """`load` skips the version it holds; weights an update changed (`changing`) are no version's until
    saved, so after an update that failed before its save, loading the version it started from restores it."""
    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02)
    policy.save(tmp_path, "a", 1)
    saved = [p.detach().clone() for p in policy.parameters("a")]
    policy.changing("a")
    spec = TrainSpec(lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=6, max_grad_norm=1.0, seed=0)
    train_agent(policy, "a", train_items(), partial(ppo_clip_loss, clip_eps=0.2), spec)
    assert any(not torch.equal(p, s) for p, s in zip(policy.parameters("a"), saved))
    policy.load(tmp_path, "a", 1)
    for p, s in zip(policy.parameters("a"), saved):
        assert torch.equal(p, s)


def test_lockstep_ranks_make_as_many_passes_and_a_spare_pass_adds_nothing():
    """5 micro-batches on 2 ranks: rank 0 takes 0, 2, 4 and rank 1 takes 1, 3; in lockstep (FSDP) rank 1
    makes a third pass, on micro-batch 0 with weight 0, so its loss and stats are those of its own two."""
    from infra.trainer import accumulate

    items = train_items(5)
    calls: dict[tuple[int, bool], list] = {}

    def run(rank: int, lockstep: bool):
        seen, weights = calls.setdefault((rank, lockstep), []), []

        def forward(micro, last):
            seen.append([it.prompt_ids for it in micro])
            return torch.full((len(micro), 5), -1.0, requires_grad=True)

        def loss_fn(logp, old, adv, mask):
            return -(logp * mask).sum() / mask.sum(), {"n": 1.0}

        out = accumulate(items, 1, forward, loss_fn, lambda loss: weights.append(loss.item()), rank, 2, False, lockstep)
        return out, weights

    (loss0, _, fwd0), w0 = run(0, True)
    (loss1, stats1, fwd1), w1 = run(1, True)
    (free1, free_stats1, free_fwd1), wf = run(1, False)
    order = [it.prompt_ids for it in by_prompt(items)]
    assert calls[(0, True)] == [[order[0]], [order[2]], [order[4]]]
    assert calls[(1, True)] == [[order[1]], [order[3]], [order[0]]]  # the spare pass: micro-batch 0 again
    assert calls[(1, False)] == [[order[1]], [order[3]]]
    assert w1[-1] == 0.0 and w1[:2] == wf and (loss1, stats1) == (free1, free_stats1)
    tokens = [len(it.response_ids) for it in by_prompt(items)]
    # each loss is 1 per token-mean, weighted by its share of the minibatch's tokens: the ranks' parts sum to 1
    assert loss0 + loss1 == pytest.approx(1.0)
    assert loss1 == pytest.approx((tokens[1] + tokens[3]) / sum(tokens))
    # the spare pass forwards tokens but trains none: each rank counts its own micro-batches only
    assert (fwd0, fwd1) == (tokens[0] + tokens[2] + tokens[4], tokens[1] + tokens[3]) and free_fwd1 == fwd1


def test_saved_moments_are_loaded_under_the_specs_learning_rate_and_decay(policy, tmp_path):
    """AdamW's load_state_dict would bring back the saved lr and weight decay: a run whose spec changed them
    (another schedule, a resume with new settings) trains with the spec's, and the moments still load."""
    from infra.trainer import TorchSteps

    spec = TrainSpec(lr=1e-2, weight_decay=0.1, epochs=1, minibatch_size=4, max_grad_norm=1.0, seed=0)
    _, saved = train_agent(policy, "a", train_items(4), partial(ppo_clip_loss, clip_eps=0.2), spec)
    torch.save(saved, tmp_path / "optimizer.pt")
    steps = TorchSteps(policy, "a", replace(spec, lr=1e-3, weight_decay=0.0, optimizer_state=tmp_path / "optimizer.pt"))
    try:
        assert [(g["lr"], g["weight_decay"]) for g in steps.opt.param_groups] == [(1e-3, 0.0)]
        for i, s in saved["state"].items():
            assert torch.equal(steps.opt.state[steps.params[i]]["exp_avg"], s["exp_avg"])
    finally:
        steps.close()


def test_reference_log_probs_reach_the_loss_and_pull_towards_the_reference(policy):
    """With A = 0 the only gradient is the KL term's: zero where the reference is the policy itself,
    non-zero where it differs; a micro-batch that mixes samples with and without reference log-probs is
    refused."""
    from tasks.losses import with_reference_kl

    def init():
        for p in policy.parameters("a"):
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))

    items = [replace(it, advantages=[0.0] * len(it.advantages)) for it in train_items()]
    init()
    new = batch_logprobs(policy, "a", items)[0]
    now = [new[i, : len(it.response_ids)].tolist() for i, it in enumerate(items)]
    kl_loss = partial(with_reference_kl, base=partial(ppo_clip_loss, clip_eps=0.2), beta=1.0)

    def grads(refs):
        init()
        spec = TrainSpec(lr=0.0, weight_decay=0.0, epochs=1, minibatch_size=len(items), max_grad_norm=1e9, seed=0)
        train_agent(policy, "a", [replace(it, ref_logprobs=r) for it, r in zip(items, refs)], kl_loss, spec)
        return torch.cat([p.grad.flatten() for p in policy.parameters("a")])

    assert grads(now).abs().max().item() < 1e-5
    assert grads([[x - 1.0 for x in lp] for lp in now]).abs().max().item() > 1e-4
    with pytest.raises(ValueError, match="mixes samples"):
        grads([None] + now[1:])
