"""Fakes of the `vllm` objects the generation engine uses (tests/test_vllm_engine.py), held to the rules the
real ones enforce: `LLM` takes only `EngineArgs` fields, `SamplingParams` validates as vLLM does,
`LoRARequest` is one adapter by name, and the engine exposes `remove_lora` and `engine_core.shutdown`."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass


@dataclass
class Logprob:  # vLLM's shape
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def completion(ids, finish="stop", extra=True):
    lps = []
    for i, t in enumerate(ids):
        step = {t: Logprob(-0.1 * (i + 1), rank=1)}
        if extra:  # with logprobs=k vLLM adds the top-k tokens: only the sampled one counts
            step[t + 1000] = Logprob(-9.0, rank=2)
        lps.append(step)
    return types.SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=finish, text="", index=0)


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
                outputs=[completion([10 + i, 2] if i % 2 == 0 else [10 + i, 11], "stop" if i % 2 == 0 else "length")],
            )
            for i, p in enumerate(prompts)
        ]

    def sleep(self, level=1):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.events.append("wake")
