"""Engines behind one interface, checked on a CPU: the registry, the vLLM request/response translation
(and the whole vLLM engine against a fake `vllm` module), the ZeRO config builder, the DeepSpeed trainer's
update against the torch trainer's (a fake `deepspeed` engine), the coach's client pool, and that the CPU
install never imports vllm or deepspeed."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from infra.engines import EngineUnavailable, engine_class, known
from infra.engines.pool import ClientPool
from infra.engines.types import GenerationRequest
from infra.engines.vllm import (LOGPROBS_MODE, AdapterTable, VLLMConfig, llm_kwargs, prompt_inputs, sampled_logprobs,
                                sampling_kwargs, to_generation, to_generations, vllm_lora_rank)
from infra.engines.zero import DeepSpeedConfig, build_zero_config, single_process_env

ROOT = Path(__file__).resolve().parents[1]


# -- the registry ----------------------------------------------------------------------------------
def test_registry_resolves_the_cpu_engines_by_name():
    from infra.engines.hf import HFGeneration
    from infra.engines.torch import TorchTrainer

    assert engine_class("generation", "hf") is HFGeneration
    assert engine_class("trainer", "torch") is TorchTrainer
    assert known("generation") == ["hf", "vllm"] and known("trainer") == ["deepspeed", "torch"]


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(EngineUnavailable, match=r"unknown generation engine 'sglang'; known: hf, vllm"):
        engine_class("generation", "sglang")
    with pytest.raises(EngineUnavailable, match=r"unknown trainer engine 'fsdp'; known: deepspeed, torch"):
        engine_class("trainer", "fsdp")
    with pytest.raises(EngineUnavailable, match="kinds: generation, trainer"):
        engine_class("coach", "x")


@pytest.mark.parametrize("kind,name,package", [("generation", "vllm", "vllm"), ("trainer", "deepspeed", "deepspeed")])
def test_a_gpu_engine_without_its_library_names_the_extra(monkeypatch, kind, name, package):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    with pytest.raises(EngineUnavailable, match=rf"needs {package}, which is not installed.*pip install -e \.\[gpu\]"):
        engine_class(kind, name)


def test_the_cpu_install_never_imports_vllm_or_deepspeed(tmp_path):
    """Fake `vllm` and `deepspeed` packages first on the path record any import; the whole package is imported,
    the run config with GPU engines validated, and the CPU engines built by name."""
    for name in ("vllm", "deepspeed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"open({str(tmp_path / 'imported')!r}, 'a').write('{name}\\n')\nraise ImportError('fake {name}')\n")
    code = """
import sys
import flows.cli, flows.train, flows.evaluate, flows.align, flows.deployments
import tasks.update, tasks.collect_rollouts, tasks.coach_evaluate, tasks.context
import infra.engines.hf, infra.engines.torch, infra.engines.vllm, infra.engines.deepspeed, infra.engines.zero
from infra.engines import engine_class
from flows.config import load_config
engine_class("generation", "hf"); engine_class("trainer", "torch")
engine_class("generation", "vllm"); engine_class("trainer", "deepspeed")  # found (the fakes), not imported
cfg = load_config("mathchat-gpu", [])
assert cfg.engines.generation == "vllm" and cfg.engines.trainer == "deepspeed"
print(sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "deepspeed")))
"""
    env = os.environ | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "imported").exists(), (tmp_path / "imported").read_text()


# -- vLLM: request translation -----------------------------------------------------------------------
def _req(**kw):
    return GenerationRequest("solver", [[1, 2, 3], [1, 2, 3], [4]], 16, **kw)


def test_sampled_requests_get_temperature_logprobs_and_a_seed_per_prompt():
    kws = sampling_kwargs(_req(temperature=0.7, seed=41), stop_ids=[2])
    assert len(kws) == 3
    for kw in kws:
        assert kw["temperature"] == 0.7 and kw["logprobs"] == 0 and kw["max_tokens"] == 16 and kw["n"] == 1
        assert kw["stop_token_ids"] == [2] and kw["detokenize"] is False and kw["top_p"] == 1.0
        assert "top_k" not in kw  # left at vLLM's default: off in every version
    assert [kw["seed"] for kw in kws] == [41, 42, 43]  # a GRPO group's duplicated prompts sample differently
    assert prompt_inputs(_req()) == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [1, 2, 3]},
                                     {"prompt_token_ids": [4]}]


def test_greedy_requests_are_temperature_zero_without_seed():
    for kw in sampling_kwargs(_req(greedy=True, temperature=0.7, seed=5), stop_ids=[9, 2]):
        assert kw["temperature"] == 0.0 and "seed" not in kw and kw["logprobs"] == 0 and kw["stop_token_ids"] == [2, 9]


def test_llm_is_built_for_our_logprob_convention_and_one_adapter_per_agent():
    kw = llm_kwargs("Qwen/Qwen3-4B-Instruct-2507", "bfloat16", 3, VLLMConfig(), n_agents=3, lora_rank=12)
    assert kw["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"  # log softmax(logits / T), as ours
    assert kw["generation_config"] == "vllm"  # no sampling defaults or stop tokens from the model's files
    assert kw["enable_lora"] and kw["max_loras"] == 3 and kw["max_lora_rank"] == 16 and kw["seed"] == 3
    assert "max_model_len" not in kw
    kw = llm_kwargs("m", "bfloat16", 0, VLLMConfig(max_loras=1, max_lora_rank=64, max_model_len=4096,
                                                   enable_sleep_mode=True), n_agents=3, lora_rank=16)
    assert kw["max_loras"] == 1 and kw["max_lora_rank"] == 64 and kw["max_model_len"] == 4096
    assert kw["enable_sleep_mode"] is True


def test_lora_rank_rounds_up_to_one_vllm_serves():
    assert [vllm_lora_rank(r) for r in (1, 8, 9, 16, 100, 300, 512)] == [8, 8, 16, 16, 128, 320, 512]
    with pytest.raises(ValueError, match="above the largest"):
        vllm_lora_rank(513)


# -- vLLM: adapters and weight sync ------------------------------------------------------------------
def test_adapter_versions_get_new_ids_and_names_and_retire_the_old():
    t = AdapterTable()
    assert t.point("solver", None) is None and t.current("solver") is None
    a1 = t.point("solver", "/run/checkpoints/solver/v0001", stamp=10)
    b1 = t.point("verifier", "/run/checkpoints/verifier/v0001", stamp=10)
    assert (a1.int_id, b1.int_id) == (1, 2) and a1.name != b1.name
    assert t.point("solver", "/run/checkpoints/solver/v0001", stamp=10) is a1  # unchanged: nothing reloads
    assert t.take_retired() == []
    a2 = t.point("solver", "/run/checkpoints/solver/v0002", stamp=11)  # after an update
    assert a2.int_id == 3 and a2.name not in (a1.name, b1.name) and t.current("solver") is a2
    a2b = t.point("solver", "/run/checkpoints/solver/v0002", stamp=12)  # the same folder rewritten
    assert a2b.int_id == 4
    assert t.take_retired() == [1, 3] and t.take_retired() == []
    assert a2b.lora_request_kwargs() == {"lora_name": a2b.name, "lora_int_id": 4,
                                         "lora_path": "/run/checkpoints/solver/v0002"}


# -- vLLM: response translation ----------------------------------------------------------------------
@dataclass
class Logprob:  # vLLM's shape
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _completion(ids, finish="stop", extra=True):
    lps = []
    for i, t in enumerate(ids):
        step = {t: Logprob(-0.1 * (i + 1), rank=1)}
        if extra:  # with logprobs=k vLLM adds the top-k tokens: only the sampled one counts
            step[t + 1000] = Logprob(-9.0, rank=2)
        lps.append(step)
    return types.SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=finish, text="", index=0)


def test_completion_becomes_our_generation_with_logprobs_in_order():
    g = to_generation([7, 8], _completion([5, 6, 2], "stop"), decode=lambda ids: " ".join(map(str, ids)))
    assert g.prompt_ids == [7, 8] and g.response_ids == [5, 6, 2]
    assert g.logprobs == pytest.approx([-0.1, -0.2, -0.3]) and g.text == "5 6 2" and g.truncated is False
    assert to_generation([7], _completion([5, 6], "length"), str).truncated is True
    plain = {"token_ids": [3], "logprobs": [{3: -1.5}], "finish_reason": "length"}  # plain dicts and floats too
    assert to_generation([1], plain, str).logprobs == [-1.5]


def test_bad_completions_are_refused_with_a_reason():
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        to_generation([1], _completion([5], "abort"), str)
    with pytest.raises(ValueError, match="logprobs=0"):
        to_generation([1], {"token_ids": [5], "logprobs": None, "finish_reason": "stop"}, str)
    with pytest.raises(ValueError, match="lack the sampled token 5"):
        sampled_logprobs([5], [{6: -1.0}])
    with pytest.raises(ValueError, match="2 log-prob entries for 1 tokens"):
        sampled_logprobs([5], [{5: -1.0}, {5: -1.0}])


def test_outputs_map_back_to_prompts_in_order():
    req = GenerationRequest("a", [[1], [2, 3]], 4)
    outs = [types.SimpleNamespace(prompt_token_ids=[1], outputs=[_completion([9])]),
            types.SimpleNamespace(prompt_token_ids=[2, 3], outputs=[_completion([8, 7], "length")])]
    gens = to_generations(req, outs, str)
    assert [g.response_ids for g in gens] == [[9], [8, 7]] and [g.truncated for g in gens] == [False, True]
    with pytest.raises(RuntimeError, match="not in prompt order"):
        to_generations(req, outs[::-1], str)
    with pytest.raises(RuntimeError, match="answered 1 of 2"):
        to_generations(req, outs[:1], str)


# -- vLLM: the engine against a fake vllm module ------------------------------------------------------
class FakeLLM:
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.removed, self.events = kwargs, [], [], []
        self.llm_engine = types.SimpleNamespace(remove_lora=self.removed.append)
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params, lora_request))
        self.events.append("generate")
        return [types.SimpleNamespace(prompt_token_ids=p["prompt_token_ids"],
                                      outputs=[_completion([10 + i, 2] if i % 2 == 0 else [10 + i, 11],
                                                           "stop" if i % 2 == 0 else "length")])
                for i, p in enumerate(prompts)]

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self):
        self.events.append("wake")


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: dict(kw)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")

    @dataclass(frozen=True)
    class LoRARequest:
        lora_name: str
        lora_int_id: int
        lora_path: str

    request.LoRARequest = LoRARequest
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    FakeLLM.instances = []
    return FakeLLM


class FakeTokenizer:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == 2))


def _checkpoint(run, agent, version):
    from infra.policy import checkpoint_dir

    d = checkpoint_dir(run, agent, version)
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_model.safetensors").write_bytes(b"weights")
    (d / "adapter_config.json").write_text("{}")
    return d


def test_vllm_engine_serves_each_agent_its_latest_adapter(fake_vllm, tmp_path):
    from infra.engines.config import EnginesConfig
    from infra.engines.vllm import VLLMGeneration
    from infra.models import ModelConfig

    engines = EnginesConfig(generation="vllm", vllm=VLLMConfig(enable_sleep_mode=True))
    mcfg = ModelConfig(name="Qwen/Qwen3-4B-Instruct-2507", dtype="bfloat16", lora_rank=16)
    eng = VLLMGeneration(types.SimpleNamespace(tokenizer=FakeTokenizer()), mcfg, engines, ["solver", "verifier"], 7)
    llm = fake_vllm.instances[0]
    assert llm.kwargs["model"] == "Qwen/Qwen3-4B-Instruct-2507" and llm.kwargs["max_loras"] == 2
    assert llm.kwargs["dtype"] == "bfloat16" and llm.kwargs["seed"] == 7

    eng.use(tmp_path, {"solver": 0, "verifier": 0})  # nothing saved yet: the base model (initial LoRA = identity)
    gens = eng.generate(GenerationRequest("solver", [[1, 2], [3]], 8, temperature=0.7, seed=100))
    prompts, params, lora = llm.calls[-1]
    assert lora is None and prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [p["seed"] for p in params] == [100, 101] and params[0]["stop_token_ids"] == [2]
    assert [g.response_ids for g in gens] == [[10, 2], [11, 11]] and [g.truncated for g in gens] == [False, True]
    assert gens[0].text == "10" and gens[0].logprobs == pytest.approx([-0.1, -0.2])

    v1 = _checkpoint(tmp_path, "solver", 1)
    eng.use(tmp_path, {"solver": 1, "verifier": 0})
    eng.generate(GenerationRequest("solver", [[1]], 8))
    first = llm.calls[-1][2]
    assert first.lora_path == str(v1.resolve()) and first.lora_int_id == 1
    eng.generate(GenerationRequest("verifier", [[1]], 8))
    assert llm.calls[-1][2] is None  # each agent its own adapter

    eng.sleep()  # the update runs
    v2 = _checkpoint(tmp_path, "solver", 2)
    eng.use(tmp_path, {"solver": 2, "verifier": 0})  # the weight sync after the update
    eng.generate(GenerationRequest("solver", [[1]], 8, greedy=True))
    second = llm.calls[-1][2]
    assert second.lora_path == str(v2.resolve()) and second.lora_int_id == 2 and second.lora_name != first.lora_name
    assert llm.removed == [1]  # the old version leaves vLLM's cache
    assert llm.calls[-1][1][0]["temperature"] == 0.0
    assert llm.events[-3:] == ["sleep1", "wake", "generate"]
    with pytest.raises(FileNotFoundError, match="v0003"):
        eng.use(tmp_path, {"solver": 3})


def test_vllm_engine_refuses_full_weights(fake_vllm):
    from infra.engines.config import EnginesConfig
    from infra.engines.vllm import VLLMGeneration
    from infra.models import ModelConfig

    with pytest.raises(ValueError, match="model.weights=lora"):
        VLLMGeneration(types.SimpleNamespace(tokenizer=FakeTokenizer()), ModelConfig(name="m", weights="full"),
                       EnginesConfig(generation="vllm"), ["a"], 0)


# -- DeepSpeed: the config builder ---------------------------------------------------------------------
def test_zero3_config():
    cfg = build_zero_config(DeepSpeedConfig(), micro_batch_size=2, max_grad_norm=1.0, bf16=False)
    assert cfg["zero_optimization"] == {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                        "stage3_param_persistence_threshold": 100_000,
                                        "stage3_gather_16bit_weights_on_model_save": False}
    assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 2 and cfg["gradient_clipping"] == 1.0
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}
    assert cfg["zero_allow_untested_optimizer"] is True and "optimizer" not in cfg and "scheduler" not in cfg


def test_zero_offload_and_stages():
    cfg = build_zero_config(DeepSpeedConfig(offload_optimizer="cpu", offload_param="cpu"), micro_batch_size=4,
                            max_grad_norm=0.5, bf16=True, world_size=8)
    z = cfg["zero_optimization"]
    assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # our torch AdamW, also when offloaded
    assert cfg["train_batch_size"] == 32 and cfg["bf16"] == {"enabled": True}
    assert build_zero_config(DeepSpeedConfig(zero_stage=0), micro_batch_size=1, max_grad_norm=1.0,
                             bf16=False)["zero_optimization"] == {"stage": 0}
    z2 = build_zero_config(DeepSpeedConfig(zero_stage=2, offload_optimizer="cpu"), micro_batch_size=1,
                           max_grad_norm=1.0, bf16=False)["zero_optimization"]
    assert z2["stage"] == 2 and "offload_param" not in z2 and "stage3_param_persistence_threshold" not in z2
    with pytest.raises(ValueError, match="offload_param needs zero_stage 3"):
        DeepSpeedConfig(zero_stage=2, offload_param="cpu")
    with pytest.raises(ValueError, match="offload_optimizer needs"):
        DeepSpeedConfig(zero_stage=0, offload_optimizer="cpu")


def test_single_process_env_fills_only_what_a_launcher_did_not_set():
    assert single_process_env({}, 1234) == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
    assert single_process_env({"MASTER_PORT": "29500", "RANK": "0"}, 1)["MASTER_ADDR"] == "127.0.0.1"
    assert "MASTER_PORT" not in single_process_env({"MASTER_PORT": "29500"}, 1)
    assert single_process_env({}, 1, local_rank=2)["LOCAL_RANK"] == "2"  # engines.device=cuda:2


# -- DeepSpeed: the trainer's update is the torch trainer's (fake deepspeed engine) -----------------------
class FakeEngine:
    """DeepSpeed's engine as the trainer uses it, at ZeRO stage 0 in fp32 on one rank: forward = the module,
    backward accumulates, step() at the accumulation boundary clips to gradient_clipping and steps."""

    def __init__(self, model, optimizer, config):
        import torch

        self.module, self.optimizer, self.config = model, optimizer, config
        self.boundary, self.norm, self.destroyed, self.torch = True, None, False, torch

    def __call__(self, *a, **kw):
        return self.module(*a, **kw)

    def set_gradient_accumulation_boundary(self, b):
        self.boundary = b

    def backward(self, loss):
        loss.backward()

    def step(self):
        assert self.boundary
        params = list(self.module.parameters())
        self.norm = self.torch.nn.utils.clip_grad_norm_(params, self.config["gradient_clipping"]).item()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_global_grad_norm(self):
        return self.norm

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
    for name, mod in (("deepspeed", ds), ("deepspeed.runtime", types.ModuleType("deepspeed.runtime")),
                      ("deepspeed.runtime.zero", types.ModuleType("deepspeed.runtime.zero")),
                      ("deepspeed.runtime.zero.partition_parameters", pp)):
        monkeypatch.setitem(sys.modules, name, mod)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(k, "1" if k == "WORLD_SIZE" else "0")  # restored after the test
    return made


@pytest.fixture(scope="module")
def policy():
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["a", "b"], seed=0)


def _items(n=6):
    import torch

    from infra.trainer import TrainItem

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        p = torch.randint(10, 1000, (5 + i,), generator=g).tolist()
        r = torch.randint(10, 1000, (3 + i % 3,), generator=g).tolist()
        out.append(TrainItem(p, r, [-7.0] * len(r), torch.randn(len(r), generator=g).tolist(), [1] * len(r)))
    return out


def test_deepspeed_trainer_makes_the_torch_trainers_update(policy, fake_deepspeed, tmp_path):
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer
    from infra.trainer import train_agent
    from tasks.losses import ppo_clip_loss

    items = _items()
    loss = partial(ppo_clip_loss, clip_eps=0.2)
    hyper = dict(lr=5e-3, weight_decay=0.01, epochs=2, minibatch_size=4, max_grad_norm=0.05, seed=3,
                 micro_batch_size=3)
    for p in policy.parameters("a"):
        torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(p.numel()))
    w0 = [p.detach().clone() for p in policy.parameters("a")]
    other = [p.detach().clone() for p in policy.parameters("b")]

    def reset():
        with torch.no_grad():
            for p, w in zip(policy.parameters("a"), w0):
                p.copy_(w)

    res_t, state_t = train_agent(policy, "a", items, loss, **hyper)
    torch.save(state_t, tmp_path / "torch.pt")
    res_t2, _ = train_agent(policy, "a", items, loss, optimizer_state=tmp_path / "torch.pt", **hyper)
    w_torch = [p.detach().clone() for p in policy.parameters("a")]

    reset()
    trainer = DeepSpeedTrainer(EnginesConfig(device="cuda", trainer="deepspeed",
                                             deepspeed=DeepSpeedConfig(zero_stage=0)))
    try:
        res_d, state_d = trainer.train(policy, "a", items, loss, **hyper)
        assert state_d["trainer"] == "deepspeed" and state_d["zero_stage"] == 0
        torch.save(state_d, tmp_path / "ds.pt")
        res_d2, _ = trainer.train(policy, "a", items, loss, optimizer_state=tmp_path / "ds.pt", **hyper)
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
    from tasks.losses import ppo_clip_loss

    trainer = DeepSpeedTrainer(EnginesConfig(device="cuda", trainer="deepspeed"))
    before = [p.detach().clone() for p in policy.parameters("a")]
    try:
        res, state = trainer.train(policy, "a", _items(2), lambda lp, o, a, m: ((lp * float("nan")).sum(), {}),
                                   lr=1e-2, weight_decay=0.0, epochs=1, minibatch_size=2, max_grad_norm=1.0, seed=0)
        assert res.skipped and state is None and "non-finite loss" in res.reason
        assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters("a")))
        res, state = trainer.train(policy, "a", _items(4), partial(ppo_clip_loss, clip_eps=0.2), lr=1e-2,
                                   weight_decay=0.0, epochs=3, minibatch_size=2, max_grad_norm=1.0, seed=0,
                                   kl_stop=-1.0)  # any KL estimate exceeds it: stop before the first step
        assert not res.skipped and res.stats["early_stopped"] == 1.0 and res.tokens == 0
        assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters("a")))
    finally:
        policy.gather = None
    assert all(e.destroyed for e in fake_deepspeed)


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
        DeepSpeedTrainer(EnginesConfig(device="cuda", trainer="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=2))
                         )._load_moments(zero3(torch.nn.Parameter(torch.ones(5))), tmp_path / "opt.pt")


def test_torch_trainer_starts_fresh_on_another_trainers_state(policy, tmp_path):
    import torch

    from infra.trainer import train_agent
    from tasks.losses import ppo_clip_loss

    torch.save({"trainer": "deepspeed", "zero_stage": 3, "layout": [[1]], "state": {}}, tmp_path / "opt.pt")
    with pytest.warns(RuntimeWarning, match="fresh AdamW moments"):
        res, _ = train_agent(policy, "b", _items(2), partial(ppo_clip_loss, clip_eps=0.2), lr=0.0, weight_decay=0.0,
                             epochs=1, minibatch_size=2, max_grad_norm=1.0, seed=0, optimizer_state=tmp_path / "opt.pt")
    assert not res.skipped


# -- the hf engine and rescoring -------------------------------------------------------------------------
def test_hf_engine_is_the_generate_it_wraps(policy):
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.hf import HFGeneration
    from infra.generation import generate

    prompts = [[1, 5, 9, 12], [1, 7]]
    torch.manual_seed(11)
    with policy.acting("a") as m:
        direct = generate(m, policy.tokenizer, prompts, 6, temperature=0.8, batch_size=4)
    eng = HFGeneration(policy, None, EnginesConfig(batch_size=4), ["a", "b"], 0)
    via = eng.generate(GenerationRequest("a", prompts, 6, temperature=0.8, seed=11))
    assert [g.response_ids for g in via] == [g.response_ids for g in direct]
    assert [g.logprobs for g in via] == [g.logprobs for g in direct]


def test_rescore_replaces_engine_logprobs_with_the_trainers(policy):
    from infra.generation import score_logprobs
    from tasks.collect_rollouts import rescore

    acts = [{"agent": "a", "episode_id": "e0", "prompt_ids": [1, 5, 9], "response_ids": [4, 6],
             "logprobs": [0.0, 0.0]},
            {"agent": "b", "episode_id": "e0", "prompt_ids": [1, 7], "response_ids": [3], "logprobs": [0.0]},
            {"agent": "a", "episode_id": "e1", "prompt_ids": [1], "response_ids": [8, 8, 8], "logprobs": [0.0] * 3}]
    gaps = rescore(policy, acts, batch_size=2, temperature=0.7)
    with policy.acting("a") as m:
        want = score_logprobs(m, [[1, 5, 9], [1]], [[4, 6], [8, 8, 8]], policy.tokenizer.pad_token_id,
                              temperature=0.7)
    assert acts[0]["logprobs"] == want[0] and acts[2]["logprobs"] == want[1]
    assert gaps["e1"] == pytest.approx(sum(-x for x in want[1]) / 3)
    assert set(gaps) == {"e0", "e1"}


# -- the coach's client pool -----------------------------------------------------------------------------
def test_client_pool_keeps_order_and_bounds_concurrency():
    lock, now, peak = threading.Lock(), [0], [0]

    def call(x):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1
        return x * x

    assert ClientPool(max_concurrency=3).map(call, range(12)) == [x * x for x in range(12)]
    assert peak[0] <= 3
    assert ClientPool(2).map(call, []) == []
    with pytest.raises(ValueError):
        ClientPool(0)


def test_llm_coach_scores_through_its_pool():
    from tasks.coach import CoachConfig, LLMCoach

    coach = LLMCoach(CoachConfig(backend="llm", concurrency=5, cache=False))
    assert isinstance(coach.pool, ClientPool) and coach.pool.max_concurrency == 5


# -- the run config ----------------------------------------------------------------------------------------
def test_gpu_preset_and_engine_checks():
    from flows.config import ConfigError, load_config

    cfg = load_config("mathchat-gpu", [])
    assert (cfg.engines.generation, cfg.engines.trainer, cfg.engines.device) == ("vllm", "deepspeed", "cuda")
    assert cfg.engines.deepspeed.zero_stage == 3 and cfg.model.weights == "lora" and cfg.model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="needs model.weights=lora"):
        load_config("mathchat-gpu", ["model.weights=full"])
    with pytest.raises(ConfigError, match="cannot serve model.name=tiny"):
        load_config("tiny", ["engines.generation=vllm"])
    with pytest.raises(ConfigError, match="set engines.device=cuda"):
        load_config("tiny", ["engines.trainer=deepspeed"])
    with pytest.raises(ConfigError, match=r"engines.generation: Input should be 'hf' or 'vllm'"):
        load_config("tiny", ["engines.generation=sglang"])
    assert load_config("tiny", ["engines.vllm.gpu_memory_utilization=0.5"]).engines.vllm.gpu_memory_utilization == 0.5
