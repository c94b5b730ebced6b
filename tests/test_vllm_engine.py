"""The `vllm` generation engine, checked on a CPU: request translation (sampling parameters, one LoRA
adapter per agent, our log-prob convention), adapter versions after an update, response translation,
and the whole engine against a fake `vllm` module."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from vllm_fakes import FakeLLM, LoRARequest, SamplingParams, completion

from infra.engines.types import GenerationRequest
from infra.engines.vllm import (
    LOGPROBS_MODE,
    AdapterTable,
    VLLMConfig,
    llm_kwargs,
    prompt_inputs,
    sampled_logprobs,
    sampling_kwargs,
    to_generation,
    to_generations,
    vllm_lora_rank,
)

ROOT = Path(__file__).resolve().parents[1]


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
    assert prompt_inputs(_req()) == [
        {"prompt_token_ids": [1, 2, 3]},
        {"prompt_token_ids": [1, 2, 3]},
        {"prompt_token_ids": [4]},
    ]


def test_greedy_requests_are_temperature_zero_without_seed():
    for kw in sampling_kwargs(_req(greedy=True, temperature=0.7, seed=5), stop_ids=[9, 2]):
        assert kw["temperature"] == 0.0 and "seed" not in kw and kw["logprobs"] == 0 and kw["stop_token_ids"] == [2, 9]


def test_stop_strings_turn_on_the_detokenizer_and_stay_in_the_output():
    for kw in sampling_kwargs(_req(stop_strings=("```", "\n\n")), stop_ids=[2]):
        assert kw["stop"] == ["```", "\n\n"] and kw["include_stop_str_in_output"] is True and kw["detokenize"]


def test_llm_is_built_for_our_logprob_convention_and_one_adapter_per_agent():
    kw = llm_kwargs("Qwen/Qwen3-4B-Instruct-2507", "bfloat16", 3, VLLMConfig(), n_agents=3, lora_rank=12)
    assert kw["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"  # log softmax(logits / T), as ours
    assert kw["generation_config"] == "vllm"  # no sampling defaults or stop tokens from the model's files
    assert kw["enable_lora"] and kw["max_loras"] == 3 and kw["max_lora_rank"] == 16 and kw["seed"] == 3
    assert "max_model_len" not in kw
    kw = llm_kwargs(
        "m",
        "bfloat16",
        0,
        VLLMConfig(max_loras=1, max_lora_rank=64, max_model_len=4096, enable_sleep_mode=True),
        n_agents=3,
        lora_rank=16,
    )
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
    assert a2b.lora_request_kwargs() == {
        "lora_name": a2b.name,
        "lora_int_id": 4,
        "lora_path": "/run/checkpoints/solver/v0002",
    }


# -- vLLM: response translation ----------------------------------------------------------------------
def test_completion_becomes_our_generation_with_logprobs_in_order():
    g = to_generation([7, 8], completion([5, 6, 2], "stop"), decode=lambda ids: " ".join(map(str, ids)))
    assert g.prompt_ids == [7, 8] and g.response_ids == [5, 6, 2]
    assert g.logprobs == pytest.approx([-0.1, -0.2, -0.3]) and g.text == "5 6 2" and g.truncated is False
    assert to_generation([7], completion([5, 6], "length"), str).truncated is True
    plain = {"token_ids": [3], "logprobs": [{3: -1.5}], "finish_reason": "length"}  # plain dicts and floats too
    assert to_generation([1], plain, str).logprobs == [-1.5]


def test_bad_completions_are_refused_with_a_reason():
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        to_generation([1], completion([5], "abort"), str)
    with pytest.raises(ValueError, match="logprobs=0"):
        to_generation([1], {"token_ids": [5], "logprobs": None, "finish_reason": "stop"}, str)
    with pytest.raises(ValueError, match="lack the sampled token 5"):
        sampled_logprobs([5], [{6: -1.0}])
    with pytest.raises(ValueError, match="2 log-prob entries for 1 tokens"):
        sampled_logprobs([5], [{5: -1.0}, {5: -1.0}])


def test_outputs_map_back_to_prompts_in_order():
    req = GenerationRequest("a", [[1], [2, 3]], 4)
    outs = [
        types.SimpleNamespace(prompt_token_ids=[1], outputs=[completion([9])]),
        types.SimpleNamespace(prompt_token_ids=[2, 3], outputs=[completion([8, 7], "length")]),
    ]
    gens = to_generations(req, outs, str)
    assert [g.response_ids for g in gens] == [[9], [8, 7]] and [g.truncated for g in gens] == [False, True]
    with pytest.raises(RuntimeError, match="not in prompt order"):
        to_generations(req, outs[::-1], str)
    with pytest.raises(RuntimeError, match="answered 1 of 2"):
        to_generations(req, outs[:1], str)


# -- vLLM: the engine against the fakes of tests/vllm_fakes.py -----------------------------------------
@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, SamplingParams
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    FakeLLM.instances = []
    return FakeLLM


def test_the_fakes_refuse_what_vllm_refuses():
    with pytest.raises(TypeError, match="'swap_space'"):  # an EngineArgs field of 0.10.2 that later releases dropped
        FakeLLM("m", swap_space=4)
    with pytest.raises(ValueError, match="max_lora_rank"):
        FakeLLM("m", max_lora_rank=12)
    for bad, match in (
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"logprobs": -2}, "logprobs"),
        ({"stop": ["x"], "detokenize": False}, "detokenize"),
        ({"stop": [""]}, "empty string"),
        ({"n": 0}, "n must be"),
        ({"n": 2, "temperature": 0.0}, "greedy"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"stop_token_ids": [None]}, "integers"),
    ):
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)
    with pytest.raises(TypeError, match="seed"):
        SamplingParams(seed=1.5)
    assert SamplingParams(temperature=0.001).temperature == 0.01
    a, b = LoRARequest("solver-1", 1, "/v1"), LoRARequest("solver-1", 2, "/v2")
    assert a == b and len({a, b}) == 1  # by name alone
    with pytest.raises(AssertionError, match="lora_path"):
        LoRARequest("solver-1", 1, "")
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("solver-0", 0, "/v0")


def test_every_request_is_one_vllm_accepts():
    from pydantic import ValidationError

    from tasks.config import RolloutConfig

    with pytest.raises(ValidationError, match="less than or equal to 2"):
        RolloutConfig(temperature=2.01)  # rollout.temperature stops where vLLM's SamplingParams does
    hottest = RolloutConfig(temperature=2.0).temperature
    for req in (
        _req(temperature=hottest, seed=2**40),
        _req(temperature=0.7, stop_strings=("```",)),
        _req(greedy=True),
        GenerationRequest("solver", [[1]], 1),
    ):
        for kw in sampling_kwargs(req, stop_ids=[2]):
            SamplingParams(**kw)
    FakeLLM(**llm_kwargs("m", "bfloat16", 0, VLLMConfig(max_lora_rank=512), n_agents=5, lora_rank=300))


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


def _team(roles: dict[str, str] | None = None):
    """What the engine reads of a TeamPolicy: its tokenizer and the role -> weights unit map."""
    return types.SimpleNamespace(tokenizer=FakeTokenizer(), unit=lambda agent: (roles or {}).get(agent, agent))


def test_vllm_engine_serves_a_shared_model_one_adapter(fake_vllm, tmp_path):
    """MARS's shared model: both roles are served the one adapter of checkpoints/shared."""
    from infra.engines.config import EnginesConfig
    from infra.engines.vllm import VLLMGeneration
    from infra.models import ModelConfig

    mcfg = ModelConfig(name="Qwen/Qwen3-4B-Instruct-2507", lora_rank=16)
    eng = VLLMGeneration(
        _team({"system2": "shared", "system1": "shared"}), mcfg, EnginesConfig(generation="vllm"), ["shared"], 0
    )
    assert fake_vllm.instances[0].kwargs["max_loras"] == 1
    v1 = _checkpoint(tmp_path, "shared", 1)
    eng.use(tmp_path, {"system2": 1, "system1": 1})
    for role in ("system2", "system1"):
        eng.generate(GenerationRequest(role, [[1]], 8))
    first, second = (c[2] for c in fake_vllm.instances[0].calls[-2:])
    assert first.lora_path == second.lora_path == str(v1.resolve()) and first.lora_int_id == second.lora_int_id == 1
    eng.close()
    eng.close()  # a second close finds nothing left to end
    assert fake_vllm.instances[0].llm_engine.engine_core.shutdowns == 1 and eng.llm is None


def test_vllm_engine_serves_each_agent_its_latest_adapter(fake_vllm, tmp_path):
    from infra.engines.config import EnginesConfig
    from infra.engines.vllm import VLLMGeneration
    from infra.models import ModelConfig

    engines = EnginesConfig(generation="vllm", vllm=VLLMConfig(enable_sleep_mode=True))
    mcfg = ModelConfig(name="Qwen/Qwen3-4B-Instruct-2507", dtype="bfloat16", lora_rank=16)
    eng = VLLMGeneration(_team(), mcfg, engines, ["solver", "verifier"], 7)
    llm = fake_vllm.instances[0]
    assert llm.kwargs["model"] == "Qwen/Qwen3-4B-Instruct-2507" and llm.kwargs["max_loras"] == 2
    assert llm.kwargs["dtype"] == "bfloat16" and llm.kwargs["seed"] == 7

    eng.use(tmp_path, {"solver": 0, "verifier": 0})  # nothing saved yet: the base model (initial LoRA = identity)
    gens = eng.generate(GenerationRequest("solver", [[1, 2], [3]], 8, temperature=0.7, seed=100))
    prompts, params, lora = llm.calls[-1]
    assert lora is None and prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [p.seed for p in params] == [100, 101] and params[0].stop_token_ids == [2]
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
    assert llm.llm_engine.removed == [1] and llm.llm_engine.loaded == {2}  # the old version leaves vLLM's cache
    assert llm.calls[-1][1][0].temperature == 0.0
    assert llm.events[-3:] == ["sleep1", "wake", "generate"]
    for version in (3, 4):  # v3 retired before it was ever served: vLLM has no such adapter to remove
        _checkpoint(tmp_path, "solver", version)
        eng.use(tmp_path, {"solver": version})
    assert llm.llm_engine.removed == [1, 2, 3] and llm.llm_engine.loaded == set()
    with pytest.raises(FileNotFoundError, match="v0005"):
        eng.use(tmp_path, {"solver": 5})


def test_vllm_engine_refuses_full_weights(fake_vllm):
    from infra.engines.config import EnginesConfig
    from infra.engines.vllm import VLLMGeneration
    from infra.models import ModelConfig

    with pytest.raises(ValueError, match="model.weights=lora"):
        VLLMGeneration(_team(), ModelConfig(name="m", weights="full"), EnginesConfig(generation="vllm"), ["a"], 0)
