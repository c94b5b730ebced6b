"""The `deepspeed` trainer, checked on a CPU: the ZeRO config builder, and the trainer's update against
the torch trainer's with a fake `deepspeed` engine (benchmarks/gpu_deepspeed.py runs the real one on a GPU)."""

from __future__ import annotations

import sys
import types
from functools import partial
from pathlib import Path

import pytest
from conftest import train_items

from infra.engines.zero import DeepSpeedConfig, build_zero_config, single_process_env

ROOT = Path(__file__).resolve().parents[1]


# -- DeepSpeed: the config builder ---------------------------------------------------------------------
def test_zero3_config():
    cfg = build_zero_config(DeepSpeedConfig(), micro_batch_size=2, max_grad_norm=1.0, bf16=False)
    assert cfg["zero_optimization"] == {
        "stage": 3,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "stage3_param_persistence_threshold": 100_000,
        "stage3_gather_16bit_weights_on_model_save": False,
    }
    assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 2 and cfg["gradient_clipping"] == 1.0
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}
    assert cfg["zero_allow_untested_optimizer"] is True and "optimizer" not in cfg and "scheduler" not in cfg


def test_zero_offload_and_stages():
    cfg = build_zero_config(
        DeepSpeedConfig(offload_optimizer="cpu", offload_param="cpu"),
        micro_batch_size=4,
        max_grad_norm=0.5,
        bf16=True,
        world_size=8,
    )
    z = cfg["zero_optimization"]
    assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # our torch AdamW, also when offloaded
    assert cfg["train_batch_size"] == 32 and cfg["bf16"] == {"enabled": True}
    assert build_zero_config(DeepSpeedConfig(zero_stage=0), micro_batch_size=1, max_grad_norm=1.0, bf16=False)[
        "zero_optimization"
    ] == {"stage": 0}
    z2 = build_zero_config(
        DeepSpeedConfig(zero_stage=2, offload_optimizer="cpu"), micro_batch_size=1, max_grad_norm=1.0, bf16=False
    )["zero_optimization"]
    assert z2["stage"] == 2 and "offload_param" not in z2 and "stage3_param_persistence_threshold" not in z2
    with pytest.raises(ValueError, match="offload_param needs zero_stage 3"):
        DeepSpeedConfig(zero_stage=2, offload_param="cpu")
    with pytest.raises(ValueError, match="offload_optimizer needs"):
        DeepSpeedConfig(zero_stage=0, offload_optimizer="cpu")


def test_single_process_env_fills_only_what_a_launcher_did_not_set():
    assert single_process_env({}, 1234) == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
    }
    assert single_process_env({"MASTER_PORT": "29500", "RANK": "0"}, 1)["MASTER_ADDR"] == "127.0.0.1"
    assert "MASTER_PORT" not in single_process_env({"MASTER_PORT": "29500"}, 1)
    assert single_process_env({}, 1, local_rank=2)["LOCAL_RANK"] == "2"  # engines.device=cuda:2


# -- DeepSpeed: the trainer's update is the torch trainer's (fake deepspeed engine) -----------------------
def _clip_as_deepspeed(params, max_norm: float):
    """DeepSpeed's clipping (deepspeed/runtime/utils.py `clip_grad_norm_`, the ZeRO optimizers'
    `unscale_and_clip_grads`): the gradients' global 2-norm; they are scaled by max_norm / (norm + 1e-6)
    only where that is below 1, so a non-finite norm leaves them as they are."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return norm


class FakeZeroOptimizer:
    """A ZeRO stage 1-3 optimizer around the client's torch optimizer, in fp32 on one rank: its step measures
    the gradients' norm into `_global_grad_norm` (0 until then), clips them and steps, whatever the norm
    (the overflow check that skips a step is fp16's, and bf16's where enabled)."""

    def __init__(self, optimizer, clip: float):
        self.optimizer, self.clip, self._global_grad_norm = optimizer, clip, 0.0

    def step(self):
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self._global_grad_norm = _clip_as_deepspeed(params, self.clip)
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)


class FakeEngine:
    """DeepSpeed's engine as the trainer uses it, on one rank in fp32 (deepspeed/runtime/engine.py of
    v0.16.0 and v0.19.6, `_configure_optimizer` and `_take_model_step`): forward = the module, backward
    accumulates, step() at the accumulation boundary. At ZeRO stage 0 it keeps the client's torch optimizer
    unwrapped: step() clips the module's gradients to gradient_clipping, discarding their norm, and steps
    even on a non-finite gradient; get_global_grad_norm() stays None, since only an optimizer that keeps
    `_global_grad_norm` (DeepSpeed's ZeRO, fp16 and bf16 ones) sets it. At stages 1-3 the ZeRO optimizer
    measures, clips and steps, and the engine reports its norm."""

    def __init__(self, model, optimizer, config):
        self.module, self.config, self.clip = model, config, config["gradient_clipping"]
        zero = config["zero_optimization"]["stage"] > 0
        self.optimizer = FakeZeroOptimizer(optimizer, self.clip) if zero else optimizer
        self.boundary, self.steps, self.destroyed, self._global_grad_norm = True, 0, False, None

    def __call__(self, *a, **kw):
        return self.module(*a, **kw)

    def set_gradient_accumulation_boundary(self, b):
        self.boundary = b

    def backward(self, loss):
        loss.backward()

    def step(self):
        assert self.boundary
        self.steps += 1
        zero = isinstance(self.optimizer, FakeZeroOptimizer)
        if not zero and self.clip > 0:
            _clip_as_deepspeed(list(self.module.parameters()), self.clip)
        self.optimizer.step()
        if hasattr(self.optimizer, "_global_grad_norm"):
            self._global_grad_norm = self.optimizer._global_grad_norm
        if zero:
            self.optimizer.zero_grad()
        else:
            for p in self.module.parameters():
                p.grad = None

    def get_global_grad_norm(self):
        return self._global_grad_norm

    def destroy(self):
        self.destroyed = True


@pytest.fixture
def fake_deepspeed(monkeypatch):
    made = []

    def initialize(model, optimizer, config):
        made.append(FakeEngine(model, optimizer, config))
        return made[-1], optimizer, None, None

    ds = types.ModuleType("deepspeed")
    ds.initialize, ds.init_distributed = initialize, lambda **kw: None
    ds.zero = types.SimpleNamespace(GatheredParameters=None)
    pp = types.ModuleType("deepspeed.runtime.zero.partition_parameters")
    pp.ZeroParamStatus = types.SimpleNamespace(NOT_AVAILABLE="not-available")
    for name, mod in (
        ("deepspeed", ds),
        ("deepspeed.runtime", types.ModuleType("deepspeed.runtime")),
        ("deepspeed.runtime.zero", types.ModuleType("deepspeed.runtime.zero")),
        ("deepspeed.runtime.zero.partition_parameters", pp),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(k, "1" if k == "WORLD_SIZE" else "0")  # restored after the test
    return made


def _items(n=6):
    return train_items(n, old_logprob=-7.0)


@pytest.mark.parametrize("stage", [0, 2])  # the trainer measures and clips at stage 0, DeepSpeed's ZeRO above
def test_deepspeed_trainer_makes_the_torch_trainers_update(policy, fake_deepspeed, tmp_path, stage):
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer
    from infra.engines.torch import train_agent
    from infra.trainer import TrainSpec
    from tasks.losses import ppo_clip_loss

    items = _items()
    loss = partial(ppo_clip_loss, clip_eps=0.2)
    hyper = dict(lr=5e-3, weight_decay=0.01, epochs=2, minibatch_size=4, max_grad_norm=0.05, seed=3, micro_batch_size=3)
    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))
    w0 = [p.detach().clone() for p in policy.parameters("a")]
    other = [p.detach().clone() for p in policy.parameters("b")]

    def reset():
        with torch.no_grad():
            for p, w in zip(policy.parameters("a"), w0):
                p.copy_(w)

    res_t, state_t = train_agent(policy, "a", items, loss, TrainSpec(**hyper))
    torch.save(state_t, tmp_path / "torch.pt")
    res_t2, _ = train_agent(policy, "a", items, loss, TrainSpec(optimizer_state=tmp_path / "torch.pt", **hyper))
    w_torch = [p.detach().clone() for p in policy.parameters("a")]

    reset()
    trainer = DeepSpeedTrainer(
        EnginesConfig(device="cuda", trainer="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=stage))
    )
    try:
        res_d, state_d = trainer.train(policy, "a", items, loss, TrainSpec(**hyper))
        assert state_d["trainer"] == "deepspeed" and state_d["zero_stage"] == stage
        torch.save(state_d, tmp_path / "ds.pt")
        res_d2, _ = trainer.train(policy, "a", items, loss, TrainSpec(optimizer_state=tmp_path / "ds.pt", **hyper))
    finally:
        policy.gather = None
    assert all(e.destroyed for e in fake_deepspeed) and len(fake_deepspeed) == 2
    assert fake_deepspeed[0].config["gradient_clipping"] == 0.05
    for a, b in zip(w_torch, policy.parameters("a")):
        torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-5)
    for a, b in zip(other, policy.parameters("b")):  # another agent's weights are never touched
        assert torch.equal(a, b)
    for r_t, r_d in ((res_t, res_d), (res_t2, res_d2)):
        assert r_t.tokens == r_d.tokens and r_t.loss == pytest.approx(r_d.loss, rel=1e-5)
        assert r_t.stats["kl"] == pytest.approx(r_d.stats["kl"], rel=1e-4, abs=1e-9)
        assert r_t.stats["grad_norm"] == pytest.approx(r_d.stats["grad_norm"], rel=1e-4)


def test_deepspeed_trainer_refuses_non_finite_and_stops_on_kl(policy, fake_deepspeed):
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer
    from infra.trainer import TrainSpec
    from tasks.losses import ppo_clip_loss

    trainer = DeepSpeedTrainer(EnginesConfig(device="cuda", trainer="deepspeed"))
    before = [p.detach().clone() for p in policy.parameters("a")]
    try:
        res, state = trainer.train(
            policy,
            "a",
            _items(2),
            lambda lp, o, a, m: ((lp * float("nan")).sum(), {}),
            TrainSpec(lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=2, max_grad_norm=1.0, seed=0),
        )
        assert res.skipped and state is None and "non-finite loss" in res.reason
        assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters("a")))
        res, state = trainer.train(
            policy,
            "a",
            _items(4),
            partial(ppo_clip_loss, clip_eps=0.2),
            TrainSpec(lr=1e-2, weight_decay=0.0, epochs=3, minibatch_size=2, max_grad_norm=1.0, seed=0, kl_stop=-1.0),
        )  # any KL estimate exceeds it: stop before the first step
        assert not res.skipped and res.stats["early_stopped"] == 1.0 and res.tokens == 0
        assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters("a")))
    finally:
        policy.gather = None
    assert all(e.destroyed for e in fake_deepspeed)


def test_deepspeed_trainer_refuses_a_non_finite_gradient_at_stage_0(policy, fake_deepspeed):
    """DeepSpeed reports no gradient norm at stage 0 and would step on a NaN gradient: the trainer measures
    it before DeepSpeed's step and refuses the update, as the torch trainer does."""
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer
    from infra.trainer import TrainSpec

    def nan_gradient(lp, old, adv, mask):  # a finite loss whose gradient is NaN
        lp.register_hook(lambda g: torch.full_like(g, float("nan")))
        return (lp * mask).sum() / mask.sum(), {}

    trainer = DeepSpeedTrainer(
        EnginesConfig(device="cuda", trainer="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=0))
    )
    before = [p.detach().clone() for p in policy.parameters("a")]
    try:
        res, state = trainer.train(
            policy,
            "a",
            _items(2),  # one minibatch: a NaN step would be the update's last, kept with NaN weights
            nan_gradient,
            TrainSpec(lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=2, max_grad_norm=1.0, seed=0),
        )
    finally:
        policy.gather = None
    assert res.skipped and state is None and "non-finite gradient norm" in res.reason
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters("a")))
    assert all(p.grad is None for p in policy.parameters("a"))
    (engine,) = fake_deepspeed
    assert engine.steps == 0 and engine.optimizer.state == {} and engine.destroyed  # AdamW never saw it


def test_zero3_moments_round_trip_through_its_empty_param_groups(tmp_path):
    """DeepSpeed's stage-3 optimizer keeps its torch optimizer's param groups empty between steps."""
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer

    def zero3(flat):
        opt = torch.optim.AdamW([flat], lr=0.1)

        class Zero3:
            optimizer = opt

            def _set_fp32_optimizer_param_groups(self):
                opt.param_groups[0]["params"].append(flat)

            def _clear_fp32_optimizer_param_groups(self):
                opt.param_groups[0]["params"] = []

        return Zero3()

    first = zero3(flat := torch.nn.Parameter(torch.ones(5)))
    flat.grad = torch.arange(5.0)
    first.optimizer.step()
    first._clear_fp32_optimizer_param_groups()
    trainer = DeepSpeedTrainer(EnginesConfig(device="cuda", trainer="deepspeed"))
    state = trainer._moments(first)
    assert state["layout"] == [[5]] and first.optimizer.param_groups[0]["params"] == []
    torch.save(state, tmp_path / "opt.pt")
    second = zero3(flat2 := torch.nn.Parameter(torch.ones(5)))
    second._clear_fp32_optimizer_param_groups()
    trainer._load_moments(second, tmp_path / "opt.pt")
    assert second.optimizer.param_groups[0]["params"] == []
    torch.testing.assert_close(second.optimizer.state[flat2]["exp_avg"], first.optimizer.state[flat]["exp_avg"])
    with pytest.warns(RuntimeWarning, match="another ZeRO stage"):
        DeepSpeedTrainer(
            EnginesConfig(device="cuda", trainer="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=2))
        )._load_moments(zero3(torch.nn.Parameter(torch.ones(5))), tmp_path / "opt.pt")


def test_torch_trainer_starts_fresh_on_another_trainers_state(policy, tmp_path):
    import torch

    from infra.engines.torch import train_agent
    from infra.trainer import TrainSpec
    from tasks.losses import ppo_clip_loss

    torch.save({"trainer": "deepspeed", "zero_stage": 3, "layout": [[1]], "state": {}}, tmp_path / "opt.pt")
    with pytest.warns(RuntimeWarning, match="fresh AdamW moments"):
        res, _ = train_agent(
            policy,
            "b",
            _items(2),
            partial(ppo_clip_loss, clip_eps=0.2),
            TrainSpec(
                lr=0.0,
                weight_decay=0.0,
                epochs=1,
                minibatch_size=2,
                max_grad_norm=1.0,
                seed=0,
                optimizer_state=tmp_path / "opt.pt",
            ),
        )
    assert not res.skipped
