"""The vLLM generation engine: one vLLM instance on the team's base model, one LoRA adapter per weights
unit (per agent, or one for the roles a shared model plays).

Translation both ways is pure and tested on CPU (tests/test_vllm_engine.py), vLLM itself is imported only
when `VLLMGeneration` is built:

- request -> vLLM: one `SamplingParams` per prompt (`sampling_kwargs`): `logprobs=0` (only the sampled
  token's log-prob comes back), `temperature=0` for greedy, a per-prompt seed, our stop token,
  `detokenize=False` (we decode with our own tokenizer, as the `hf` engine does); the prompt goes in
  as token ids. The acting agent's adapter goes in as a `LoRARequest` (`AdapterTable`).
- vLLM -> us: `RequestOutput.outputs[0]` (`token_ids`, `logprobs` as one `{token_id: Logprob}` per
  generated token, `finish_reason`) -> `Generation` (`to_generation`).

Log-prob convention. Ours (infra/generation.py) are log softmax(logits / T) of the distribution the
token was sampled from (greedy: T = 1), so a trainer scoring with the same T is on-policy. vLLM's V1
engine returns *raw* log-probs by default (log softmax(logits), before temperature: vLLM >= 0.10
`logprobs_mode="raw_logprobs"`), which differ from ours whenever T != 1. `logprobs_mode=
"processed_logprobs"` returns them after temperature (and top-k / top-p, which we leave off), and for
greedy requests before any temperature, i.e. exactly ours; vLLM >= 0.10.2 has that meaning (the
`gpu` extra pins it). The numbers still differ slightly from the trainer's own forward (bf16
kernels, batching): `engines.rescore_logprobs` replaces them with the trainer's (see the README).

Weight sync. After an update the agent's new adapter is a checkpoint folder (`checkpoints/<agent>/
vNNNN/`, peft format: adapter_config.json + adapter_model.safetensors). `use()` points each agent at
its current folder; a folder not served before gets a new `lora_int_id` and name, so vLLM loads the
new weights (it caches adapters by id and compares requests by name) and never serves stale KV-cache
blocks of the old version; the old id is dropped from vLLM's cache.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.engines.types import Generation, GenerationRequest

LOGPROBS_MODE = "processed_logprobs"
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts (>= 8)
SEED_MOD = 2**31


class VLLMConfig(BaseModel):
    """The `vllm` generation engine (engines.generation=vllm)."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(
        0.35,
        gt=0,
        le=0.95,
        description="fraction of the GPU's memory vLLM "
        "takes (weights + KV cache); the rest stays for the trainer's copy of the "
        "model on the same GPU",
    )
    max_loras: int | None = Field(
        None, ge=1, description="adapters vLLM holds on the GPU at once (None: one per agent)"
    )
    max_lora_rank: int | None = Field(
        None,
        ge=1,
        le=512,
        description="largest LoRA rank served (None: model.lora_rank, rounded up to a rank vLLM supports)",
    )
    max_model_len: int | None = Field(
        None, ge=64, description="context length vLLM plans its KV cache for (None: the model's; smaller saves memory)"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM instance shards the model over")
    enforce_eager: bool = Field(False, description="no CUDA graphs / torch.compile: starts faster, generates slower")
    enable_sleep_mode: bool = Field(
        False,
        description="while an agent is updated, vLLM offloads its weights to "
        "CPU memory and drops its KV cache (sleep level 1), woken before the next "
        "rollout: frees GPU memory for the trainer when both share one GPU",
    )


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that serves adapters of rank `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})")


def llm_kwargs(model: str, dtype: str, seed: int, cfg: VLLMConfig, n_agents: int, lora_rank: int) -> dict:
    """Keyword arguments of `vllm.LLM(...)`."""
    out = {
        "model": model,
        "tokenizer": model,
        "dtype": dtype,
        "seed": seed,
        "enable_lora": True,
        "max_loras": cfg.max_loras or n_agents,
        "max_lora_rank": vllm_lora_rank(cfg.max_lora_rank or lora_rank),
        "max_cpu_loras": 2 * (cfg.max_loras or n_agents),  # room for the versions being swapped in
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "enforce_eager": cfg.enforce_eager,
        "enable_sleep_mode": cfg.enable_sleep_mode,
        "logprobs_mode": LOGPROBS_MODE,
        # no sampling defaults or extra stop tokens from the model's generation_config.json: the
        # request says everything, as with the `hf` engine
        "generation_config": "vllm",
    }
    if cfg.max_model_len:
        out["max_model_len"] = cfg.max_model_len
    return out


def sampling_kwargs(req: GenerationRequest, stop_ids: Sequence[int]) -> list[dict]:
    """`SamplingParams(**kw)` per prompt: greedy = temperature 0 (vLLM's greedy; no seed needed),
    sampled = temperature T with top-k / top-p off and its own seed per prompt. Stop strings need
    vLLM's detokenizer and stay in the output, as with the `hf` engine."""
    base = {
        "n": 1,
        "max_tokens": req.max_new_tokens,
        "logprobs": 0,
        "stop_token_ids": sorted(stop_ids),
        "detokenize": bool(req.stop_strings),
        "top_p": 1.0,
    }
    if req.stop_strings:
        base |= {"stop": list(req.stop_strings), "include_stop_str_in_output": True}
    if req.greedy:
        return [base | {"temperature": 0.0} for _ in req.prompts]
    return [base | {"temperature": req.temperature, "seed": (req.seed + i) % SEED_MOD} for i in range(len(req.prompts))]


def prompt_inputs(req: GenerationRequest) -> list[dict]:
    """vLLM's token prompts (`TokensPrompt` is this dict)."""
    return [{"prompt_token_ids": list(p)} for p in req.prompts]


@dataclass(frozen=True)
class Adapter:
    """One adapter version as vLLM knows it: `LoRARequest(name, int_id, path)`."""

    name: str
    int_id: int
    path: str

    def lora_request_kwargs(self) -> dict:
        return {"lora_name": self.name, "lora_int_id": self.int_id, "lora_path": self.path}


class AdapterTable:
    """Which adapter version each agent is served with. Pointing an agent at a checkpoint it is not
    already served from (another folder, or the same folder rewritten: another `stamp`) mints a new
    id and name, so vLLM loads the new weights; the replaced ids are collected in `retired`."""

    def __init__(self):
        self._next = 1
        self._now: dict[str, tuple[tuple[str, Any], Adapter] | None] = {}
        self.retired: list[int] = []

    def point(self, agent: str, path: str | None, stamp: Any = None) -> Adapter | None:
        """Serve `agent` from checkpoint folder `path` (None: the base model, no adapter)."""
        cur = self._now.get(agent)
        if path is None:
            new = None
        elif cur is not None and cur[0] == (path, stamp):
            return cur[1]
        else:
            adapter = Adapter(f"{agent}-{self._next}", self._next, path)
            self._next += 1
            new = ((path, stamp), adapter)
        if cur is not None:
            self.retired.append(cur[1].int_id)
        self._now[agent] = new
        return None if new is None else new[1]

    def current(self, agent: str) -> Adapter | None:
        entry = self._now.get(agent)
        return None if entry is None else entry[1]

    def take_retired(self) -> list[int]:
        out, self.retired = self.retired, []
        return out


def _field(obj, name: str):
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def sampled_logprobs(token_ids: Sequence[int], logprobs) -> list[float]:
    """The log-prob of each sampled token, in order, from vLLM's per-token `{token_id: Logprob}` maps
    (a Logprob object with `.logprob`, or a plain float)."""
    if logprobs is None:
        raise ValueError("vLLM returned no log-probs: the request must set SamplingParams(logprobs=0)")
    if len(logprobs) != len(token_ids):
        raise ValueError(f"vLLM returned {len(logprobs)} log-prob entries for {len(token_ids)} tokens")
    out = []
    for pos, tok in enumerate(token_ids):
        step = logprobs[pos]
        if tok not in step:
            raise ValueError(f"vLLM's log-probs at position {pos} lack the sampled token {tok}")
        v = step[tok]
        out.append(float(getattr(v, "logprob", v)))
    return out


def to_generation(prompt_ids: Sequence[int], completion, decode: Callable[[list[int]], str]) -> Generation:
    """Our Generation from one vLLM `CompletionOutput` (or a dict of its fields). `finish_reason`
    "length" = cut at max_new_tokens (`truncated`); "stop" = ended on the stop token, which stays in
    the response as with the `hf` engine; anything else (an aborted request) is an error."""
    finish = _field(completion, "finish_reason")
    if finish not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with finish_reason={finish!r}")
    ids = [int(t) for t in _field(completion, "token_ids")]
    return Generation(
        prompt_ids=list(prompt_ids),
        response_ids=ids,
        logprobs=sampled_logprobs(ids, _field(completion, "logprobs")),
        text=decode(ids),
        truncated=finish == "length",
    )


def to_generations(req: GenerationRequest, outputs: Sequence, decode: Callable[[list[int]], str]) -> list[Generation]:
    """One Generation per prompt from `LLM.generate`'s RequestOutputs (in prompt order)."""
    if len(outputs) != len(req.prompts):
        raise RuntimeError(f"vLLM answered {len(outputs)} of {len(req.prompts)} prompts")
    gens = []
    for prompt, out in zip(req.prompts, outputs):
        got = _field(out, "prompt_token_ids")
        if got is not None and list(got) != list(prompt):
            raise RuntimeError("vLLM's outputs are not in prompt order")
        gens.append(to_generation(prompt, _field(out, "outputs")[0], decode))
    return gens


def serving_path(model_name: str) -> str:
    """What vLLM loads for ModelConfig.name: the converted SmolLM2 folder, or the name itself (a Hugging
    Face id or a local folder). The random `tiny` model exists only in memory."""
    from infra.models import SMOLLM2, smollm2_dir

    if model_name == "tiny":
        raise ValueError(
            "engines.generation=vllm cannot serve model.name=tiny (a random model built in memory); "
            "use a Hugging Face id, a local folder or smollm2-135m-instruct"
        )
    return str(smollm2_dir()) if model_name == SMOLLM2 else model_name


class VLLMGeneration:
    """vLLM behind the GenerationEngine interface (infra/engines/types.py)."""

    name = "vllm"

    def __init__(self, policy, model_cfg, engines, agents: list[str], seed: int):
        from vllm import LLM

        if model_cfg.weights != "lora":
            raise ValueError("engines.generation=vllm serves one LoRA adapter per agent: it needs model.weights=lora")
        self.cfg = engines.vllm
        self.tokenizer, self.unit = policy.tokenizer, policy.unit  # an agent's adapter is its weights unit's
        self.stop_ids = (self.tokenizer.eos_token_id,)
        self.llm = LLM(
            **llm_kwargs(
                serving_path(model_cfg.name), model_cfg.dtype, seed, self.cfg, len(agents), model_cfg.lora_rank
            )
        )
        self.adapters = AdapterTable()
        self.asleep = False

    def use(self, run_dir, versions: dict[str, int]) -> None:
        from infra.policy import checkpoint_dir

        for agent, version in versions.items():
            unit = self.unit(agent)
            d = checkpoint_dir(run_dir, unit, version)
            weights = d / "adapter_model.safetensors"
            if weights.exists():
                self.adapters.point(unit, str(d.resolve()), weights.stat().st_mtime_ns)
            elif version == 0:  # never saved: peft's initial adapter is the identity (B = 0), i.e. the base
                self.adapters.point(unit, None)
            else:
                raise FileNotFoundError(f"no adapter checkpoint {d}")
        for old in self.adapters.take_retired():
            # False where vLLM holds no such adapter (never served, or already evicted): nothing to free
            self.llm.llm_engine.remove_lora(old)

    def generate(self, request: GenerationRequest) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        if not request.prompts:
            return []
        self.wake()
        stop = request.stop_ids or self.stop_ids
        params = [SamplingParams(**kw) for kw in sampling_kwargs(request, stop)]
        adapter = self.adapters.current(self.unit(request.agent))
        lora = LoRARequest(**adapter.lora_request_kwargs()) if adapter else None
        outs = self.llm.generate(prompt_inputs(request), params, lora_request=lora, use_tqdm=False)
        return to_generations(request, outs, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))

    def sleep(self) -> None:
        if self.cfg.enable_sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:  # not closed already
            # the engine core runs in its own process (V1), which would otherwise hold the GPU until exit
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
