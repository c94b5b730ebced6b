"""The `vllm` generation engine, checked on a CPU: request translation (sampling parameters, one LoRA
adapter per agent, our log-prob convention), adapter versions after an update, response translation,
and the whole engine against a fake `vllm` module."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

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
    outs = [
        types.SimpleNamespace(prompt_token_ids=[1], outputs=[_completion([9])]),
        types.SimpleNamespace(prompt_token_ids=[2, 3], outputs=[_completion([8, 7], "length")]),
    ]
    gens = to_generations(req, outs, str)
    assert [g.response_ids for g in gens] == [[9], [8, 7]] and [g.truncated for g in gens] == [False, True]
    with pytest.raises(RuntimeError, match="not in prompt order"):
        to_generations(req, outs[::-1], str)
    with pytest.raises(RuntimeError, match="answered 1 of 2"):
        to_generations(req, outs[:1], str)


# -- vLLM: the engine against a fake vllm module ------------------------------------------------------
# The fakes enforce what the real objects enforce, read in the sources of the vLLM releases 0.10.2, 0.11.0,
# 0.20.2, 0.22.1, 0.23.0, 0.24.0, 0.27.1 and 0.33.0 (the range of pyproject.toml's `gpu` extra): a rule
# that holds in one of them holds here.

# `LLM(model, **kw)` builds the `EngineArgs` dataclass of vllm/engine/arg_utils.py from its keywords, which
# raises TypeError on any other name: these are its fields in every release listed above.
ENGINE_ARGS = frozenset(
    """
    additional_config allowed_local_media_path async_scheduling block_size code_revision collect_detailed_traces
    compilation_config config_format convert cpu_offload_gb data_parallel_address data_parallel_backend
    data_parallel_hybrid_lb data_parallel_rank data_parallel_rpc_port data_parallel_size
    data_parallel_size_local data_parallel_start_rank decode_context_parallel_size default_mm_loras
    disable_cascade_attn disable_chunked_mm_input disable_custom_all_reduce disable_hybrid_kv_cache_manager
    disable_log_stats disable_sliding_window distributed_executor_backend download_dir dtype
    enable_chunked_prefill enable_eplb enable_expert_parallel enable_lora enable_prefix_caching
    enable_prompt_embeds enable_sleep_mode enforce_eager eplb_config fully_sharded_loras generation_config
    gpu_memory_utilization hf_config_path hf_overrides hf_token ignore_patterns interleave_mm_strings
    io_processor_plugin kv_cache_dtype kv_cache_memory_bytes kv_events_config kv_sharing_fast_prefill
    kv_transfer_config limit_mm_per_prompt load_format logits_processors logprobs_mode
    long_prefill_token_threshold lora_dtype mamba_cache_dtype mamba_ssm_cache_dtype max_cpu_loras max_logprobs
    max_lora_rank max_loras max_model_len max_num_batched_tokens max_num_seqs max_parallel_loading_workers
    media_io_kwargs mm_encoder_tp_mode mm_processor_cache_gb mm_processor_kwargs model model_impl
    model_loader_extra_config num_gpu_blocks_override otlp_traces_endpoint override_generation_config
    pipeline_parallel_size prefix_caching_hash_algo pt_load_map_location quantization ray_workers_use_nsight
    reasoning_parser revision runner safetensors_load_strategy scheduler_cls scheduling_policy seed
    served_model_name show_hidden_metrics_for_version skip_mm_profiling skip_tokenizer_init speculative_config
    tensor_parallel_size tokenizer tokenizer_mode tokenizer_revision trust_remote_code use_tqdm_on_load
    worker_cls worker_extension_cls
    """.split()
)
LORA_MAX_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py's accepted max_lora_rank (0.33.0 adds 1)
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


class SamplingParams:
    """vllm.SamplingParams (vllm/sampling_params.py: `__post_init__`, `_verify_args`) for the fields the
    engine sets; another keyword is refused (a field we start using gets its checks here first). vLLM
    0.10.2-0.11 raise ValueError, later releases VLLMValidationError: ValueError stands for both."""

    DEFAULTS = {
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": None,
        "stop": None,
        "stop_token_ids": None,
        "max_tokens": 16,
        "logprobs": None,
        "detokenize": True,
        "include_stop_str_in_output": False,
    }

    def __init__(self, **kw):
        if unknown := sorted(set(kw) - set(self.DEFAULTS)):
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        for k, v in (self.DEFAULTS | kw).items():
            setattr(self, k, v)
        if 0 < self.temperature < 0.01:  # vLLM raises it to 0.01, with a warning
            self.temperature = 0.01
        if self.seed == -1:
            self.seed = None
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._verify()
        if self.temperature < 1e-5:  # greedy
            self.top_p = 1.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int of at least 1, got {self.n!r}.")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:  # <= 2: vLLM >= 0.24
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if not all(isinstance(t, int) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")
        # vLLM takes any seed here, but its model runner seeds a torch.Generator with it (gpu_model_runner.py),
        # which fails on anything but an int: refused at once
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")


class LoRARequest:
    """vllm.lora.request.LoRARequest: equal and hashed by name alone, so a new version of an adapter needs
    a new name; the path must not be empty, the id at least 1 (vLLM >= 0.11)."""

    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = ""):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path
        if lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {lora_int_id}")
        assert lora_path, "lora_path cannot be empty"

    def __eq__(self, other):
        return isinstance(other, LoRARequest) and other.lora_name == self.lora_name

    def __hash__(self):
        return hash(self.lora_name)


class FakeEngineCore:
    """V1's engine-core client (`LLM.llm_engine.engine_core`): shutdown() ends the engine-core process."""

    def __init__(self):
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


class FakeLLMEngine:
    """`LLM.llm_engine`, V1's LLMEngine: an adapter is loaded by the first request naming it, and
    remove_lora(id) (the executor asserts id > 0) answers whether one was loaded."""

    def __init__(self):
        self.loaded: set[int] = set()
        self.removed: list[int] = []
        self.engine_core = FakeEngineCore()

    def remove_lora(self, lora_id: int) -> bool:
        assert lora_id > 0, "lora_id must be greater than 0."
        self.removed.append(lora_id)
        if lora_id not in self.loaded:
            return False
        self.loaded.remove(lora_id)
        return True


class FakeLLM:
    """vllm.LLM as the engine uses it: its keywords must be EngineArgs fields and pass LoRAConfig's checks
    (vllm/config/lora.py), generate takes one SamplingParams per prompt and the adapter as a LoRARequest."""

    instances: list = []

    def __init__(self, model: str, **kwargs):
        if unknown := sorted(set(kwargs) - ENGINE_ARGS):
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if kwargs.get("max_lora_rank", 16) not in LORA_MAX_RANKS:
            raise ValueError(f"max_lora_rank ({kwargs['max_lora_rank']}) must be one of {LORA_MAX_RANKS}.")
        if kwargs.get("max_cpu_loras") is not None and kwargs["max_cpu_loras"] < kwargs.get("max_loras", 1):
            raise ValueError("max_cpu_loras must be >= max_loras")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {kwargs['logprobs_mode']!r}")
        self.kwargs, self.calls, self.events = {"model": model} | kwargs, [], []
        self.llm_engine = FakeLLMEngine()
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None):
        assert all(isinstance(p, SamplingParams) for p in sampling_params)
        if len(sampling_params) != len(prompts):
            raise ValueError("The lengths of prompts and params must be the same.")
        if lora_request is not None:
            assert isinstance(lora_request, LoRARequest)
            self.llm_engine.loaded.add(lora_request.lora_int_id)
        self.calls.append((prompts, sampling_params, lora_request))
        self.events.append("generate")
        return [
            types.SimpleNamespace(
                prompt_token_ids=p["prompt_token_ids"],
                outputs=[_completion([10 + i, 2] if i % 2 == 0 else [10 + i, 11], "stop" if i % 2 == 0 else "length")],
            )
            for i, p in enumerate(prompts)
        ]

    def sleep(self, level=1):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.events.append("wake")


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
