"""Data-parallel training ranks (`engines.train_ranks`, infra/ranks.py): 2 ranks on gloo make the update 1
rank makes (up to float rounding), each rank forwarding its share of the tokens, for LoRA adapters and full
weights, the other agents untouched; a run trained on 2 ranks ends where the 1-rank run ends; a rank killed
in the middle of an update fails it with an error naming the rank, nothing of it is written, and `--resume`
finishes the run as if nothing happened."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from conftest import tiny_config, train_items

from infra.engines.torch import train_agent
from infra.ranks import RankFailed, spawn_ranks
from infra.trainer import TrainSpec
from tasks.losses import LOSSES

SPEC = TrainSpec(lr=1e-2, weight_decay=0.0, epochs=2, minibatch_size=4, max_grad_norm=1.0, seed=3, micro_batch_size=1)
LOSS = partial(LOSSES["ppo_clip"], clip_eps=0.2)


def _policy(weights: str):
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    return TeamPolicy(ModelConfig(name="tiny", weights=weights, lora_rank=4, lora_alpha=8), ["a", "b"], seed=0)


def _params(policy, agent: str) -> list[torch.Tensor]:
    with policy.materialized(agent):
        return [p.detach().clone() for p in policy.parameters(agent)]


def _rank(weights: str, spec: TrainSpec = SPEC, *, rank: int, world: int) -> None:
    """A helper rank of the trainer-level test: the same replica and batch, its share of each minibatch."""
    train_agent(_policy(weights), "a", train_items(7), LOSS, replace(spec, rank=rank, world=world))


def _sharded_rank(spec: TrainSpec, *, rank: int, world: int) -> None:
    """A helper rank of a full-weights update: it takes part in gathering the moments and keeps none."""
    _, state = train_agent(_policy("full"), "a", train_items(7), LOSS, replace(spec, rank=rank, world=world))
    assert state is not None and not state["state"], f"helper rank {rank} kept the gathered moments"


def _fail(rank: int, world: int) -> None:
    raise ValueError("the helper's own error")


@pytest.mark.slow  # spawns the rank processes
@pytest.mark.parametrize("weights", ["lora", "full"])
def test_two_ranks_make_the_one_rank_update(weights):
    one = _policy(weights)
    res1, _ = train_agent(one, "a", train_items(7), LOSS, SPEC)
    two = _policy(weights)
    b_before = _params(two, "b")
    with spawn_ranks(2, 1, _rank, (weights,)):
        res2, _ = train_agent(two, "a", train_items(7), LOSS, replace(SPEC, world=2))
    assert not res1.skipped and not res2.skipped and res1.tokens == res2.tokens
    # the work was split, not repeated: the ranks' forward passes cover the one rank's tokens once, each
    # rank about half (within one micro-batch, at most 5 tokens here, per minibatch step)
    assert res1.rank_tokens == (res1.tokens,) and sum(res2.rank_tokens) == res1.tokens
    steps = SPEC.epochs * -(-7 // SPEC.minibatch_size)
    assert all(abs(f - res1.tokens / 2) <= 5 * steps for f in res2.rank_tokens) and min(res2.rank_tokens) > 0
    assert res2.loss == pytest.approx(res1.loss, rel=1e-4, abs=1e-6)
    assert res2.stats["grad_norm"] == pytest.approx(res1.stats["grad_norm"], rel=1e-4)
    start, w1, w2 = _params(_policy(weights), "a"), _params(one, "a"), _params(two, "a")
    step = torch.cat([(p - s).flatten() for p, s in zip(w1, start)]).norm()
    gap = torch.cat([(q - p).flatten() for p, q in zip(w1, w2)]).norm()
    # Adam divides by sqrt(v): where a gradient is ~0, rounding differs in the step, so the whole update is
    # compared with its own size
    assert step > 0 and gap / step < 1e-3, (gap, step)
    for p, q in zip(b_before, _params(two, "b")):
        assert torch.equal(p, q)


@pytest.mark.slow  # spawns the rank processes
def test_full_weights_on_two_ranks_are_sharded_and_carry_the_one_rank_moments(tmp_path):
    """FSDP2 (infra/sharded.py): each rank holds half of the agent's weights and AdamW moments; starting from
    moments a one-rank update saved, two ranks end with the one-rank update's weights and moments, gathered
    whole in the one-rank layout on rank 0 (the helper keeps none)."""
    from infra.sharded import ShardedSteps
    from infra.trainer import train_loop

    _, saved = train_agent(_policy("full"), "a", train_items(5), LOSS, SPEC)
    torch.save(saved, tmp_path / "optimizer.pt")
    spec = replace(SPEC, optimizer_state=tmp_path / "optimizer.pt")
    one = _policy("full")
    _, state1 = train_agent(one, "a", train_items(7), LOSS, spec)
    two = _policy("full")
    with spawn_ranks(2, 1, _sharded_rank, (spec,)):
        steps = ShardedSteps(two, "a", replace(spec, world=2))
        local = sum(p.to_local().numel() for p in steps.params)
        moments = sum(v.to_local().numel() for s in steps.opt.state.values() for k, v in s.items() if k != "step")
        _, state2 = train_loop(steps, train_items(7), LOSS, replace(spec, world=2))
    whole = sum(p.numel() for p in two.parameters("a"))
    assert local <= whole // 2 + 1024 and moments == 2 * local  # each rank: its half (rows split unevenly)
    w1, w2 = _params(one, "a"), _params(two, "a")
    gap = torch.cat([(q - p).flatten() for p, q in zip(w1, w2)]).norm() / torch.cat([p.flatten() for p in w1]).norm()
    assert gap < 1e-5, gap
    assert state2 is not None and state1["param_groups"] == state2["param_groups"]
    assert state1["state"].keys() == state2["state"].keys()
    for i, s1 in state1["state"].items():
        assert torch.equal(s1["step"], state2["state"][i]["step"])
        for k in ("exp_avg", "exp_avg_sq"):
            assert type(state2["state"][i][k]) is torch.Tensor and s1[k].shape == state2["state"][i][k].shape
            torch.testing.assert_close(state2["state"][i][k], s1[k], rtol=1e-3, atol=1e-7)


@pytest.mark.slow  # spawns the rank processes
def test_a_helper_rank_that_raises_fails_the_update_naming_it():
    policy = _policy("lora")
    before = _params(policy, "a")
    with pytest.raises(RankFailed, match="training rank 1 of 2 failed: ValueError: the helper's own error"):
        with spawn_ranks(2, 1, _fail, ()):
            train_agent(policy, "a", train_items(7), LOSS, replace(SPEC, world=2))
    for p, q in zip(before, _params(policy, "a")):  # rank 0's replica is back where it started
        assert torch.equal(p, q)


RUN = ("evaluate=false", "seed=2", "algorithm.minibatch_size=2")  # several steps per update: a rank can die mid-way


def _run(root, run_id, *overrides):
    from flows.train import train

    return train(config=tiny_config(root, f"run.id={run_id}", *RUN, *overrides))


def _same_run(a, b, weights: str = "adapter_model.safetensors"):
    from infra import store
    from infra.policy import checkpoint_dir, latest_version

    acts = [store.read_table(r, "actions").sort_values(["iteration", "phase", "episode_id", "turn"]) for r in (a, b)]
    assert [list(r) for r in acts[0]["response_ids"]] == [list(r) for r in acts[1]["response_ids"]]
    ua, ub = (store.read_table(r, "updates").sort_values(["iteration", "agent"]) for r in (a, b))
    assert ua["version_after"].tolist() == ub["version_after"].tolist()
    np.testing.assert_allclose(ub["loss"].astype(float), ua["loss"].astype(float), rtol=1e-3, atol=1e-6)
    from safetensors.torch import load_file

    for agent in ("solver", "executor", "verifier"):
        v = latest_version(a, agent)
        assert v == latest_version(b, agent)
        wa = load_file(checkpoint_dir(a, agent, v) / weights)
        wb = load_file(checkpoint_dir(b, agent, v) / weights)
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_a_run_on_two_ranks_ends_where_one_rank_ends_and_survives_a_killed_rank(prefect_harness, tmp_path, monkeypatch):
    from flows.train import train
    from infra import store

    one = _run(tmp_path, "one")
    # on two ranks, rank 1 SIGKILLed after its second optimizer step of the first update; the resumed run
    # redoes that update on two ranks and ends where the one-rank run ends
    monkeypatch.setenv("TEAMRL_FAULT", "rank1:2:kill")
    with pytest.raises(Exception) as failed:
        _run(tmp_path, "killed", "engines.train_ranks=2")
    chain = [failed.value, *(e for e in (failed.value.__cause__, failed.value.__context__) if e)]
    assert any("training rank 1 of 2 failed: exit code -9" in str(e) for e in chain), chain
    killed = tmp_path / "killed"
    assert not (killed / "updates").exists() or not len(store.read_table(killed, "updates", 1))
    assert not (killed / "checkpoints" / "solver" / "v0001").exists()
    monkeypatch.delenv("TEAMRL_FAULT")
    train(config=tiny_config(tmp_path, *RUN, "engines.train_ranks=2"), resume="killed")
    _same_run(one, killed)


@pytest.mark.slow
def test_a_full_weights_run_sharded_on_two_ranks_ends_where_one_rank_ends(prefect_harness, tmp_path):
    full = ("model.weights=full", "algorithm.lr=1e-5")
    _same_run(_run(tmp_path, "one", *full), _run(tmp_path, "two", *full, "engines.train_ranks=2"), "model.safetensors")


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.lin = _Inner(), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.inner(x))


class _Nested(torch.nn.Module):
    _no_split_modules = ["_Outer", "_Inner"]  # an unsplittable block inside another

    def __init__(self):
        super().__init__()
        self.outer = _Outer()

    def forward(self, x):
        return self.outer(x)


def test_shard_wraps_nested_blocks_inner_first(tmp_path):
    """FSDP2 must wrap a unit before the unit that holds it (wrapped outer-first, the backward fails)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from infra.sharded import shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = shard(_Nested(), 1, "cpu")
        model(torch.ones(2, 4)).sum().backward()
        assert all(isinstance(m, FSDPModule) for m in (model, model.outer, model.outer.inner))
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()
