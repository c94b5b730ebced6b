"""The DeepSpeed ZeRO configuration: the trainer's knobs and the config dict `deepspeed.initialize` takes.

Pure (no deepspeed or torch import) so the CPU tests check what a GPU run would be given.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

QUIET_STEPS = 2**31 - 1  # DeepSpeed prints a line every `steps_per_print` steps: never


class DeepSpeedConfig(BaseModel):
    """The `deepspeed` trainer (engines.trainer=deepspeed): ZeRO stage and offloading."""

    model_config = ConfigDict(extra="forbid")

    zero_stage: Literal[0, 1, 2, 3] = Field(
        3,
        description="ZeRO stage: 0 (plain data parallel), 1 (optimizer "
        "state partitioned), 2 (+ gradients), 3 (+ the trained parameters)",
    )
    offload_optimizer: Literal["none", "cpu"] = Field(
        "none", description="keep the optimizer state (and the fp32 master weights) in CPU memory (stages 1-3)"
    )
    offload_param: Literal["none", "cpu"] = Field(
        "none", description="keep the partitioned trained parameters in CPU memory between uses (stage 3 only)"
    )
    overlap_comm: bool = Field(
        False,
        description="overlap gradient reduction with the backward pass (helps with several GPUs, costs buffer memory)",
    )
    param_persistence_threshold: int = Field(
        100_000,
        ge=0,
        description="stage 3: parameters with fewer elements "
        "than this are never partitioned (LoRA matrices usually are below)",
    )

    @model_validator(mode="after")
    def _stage_fits(self):
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError("offload_param needs zero_stage 3")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        return self


def build_zero_config(
    cfg: DeepSpeedConfig, *, micro_batch_size: int, max_grad_norm: float, bf16: bool, world_size: int = 1
) -> dict:
    """The dict for `deepspeed.initialize(config=...)`.

    The optimizer is ours (torch AdamW, passed to `initialize`), so the update is the torch trainer's:
    hence `zero_allow_untested_optimizer` (ZeRO accepts torch AdamW anyway) and, with optimizer
    offload, `zero_force_ds_cpu_optimizer: false` (else DeepSpeed insists on its own CPU Adam).
    Gradient accumulation is driven by hand (`set_gradient_accumulation_boundary`), with micro-batches
    weighted by their token share, so DeepSpeed's own accumulation count stays 1.
    `bf16` mirrors the trained parameters' dtype (peft keeps LoRA weights in fp32 on a bf16 base).
    """
    zero: dict = {"stage": cfg.zero_stage}
    if cfg.zero_stage > 0:
        zero |= {"overlap_comm": cfg.overlap_comm, "contiguous_gradients": True}
    if cfg.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": cfg.offload_optimizer, "pin_memory": True}
    if cfg.zero_stage == 3:
        zero |= {
            "stage3_param_persistence_threshold": cfg.param_persistence_threshold,
            "stage3_gather_16bit_weights_on_model_save": False,
        }
        if cfg.offload_param != "none":
            zero["offload_param"] = {"device": cfg.offload_param, "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "gradient_clipping": max_grad_norm,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }


DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def single_process_env(environ: Mapping[str, str], port: int, local_rank: int = 0) -> dict[str, str]:
    """The torch.distributed variables a launcher would set, for the one-process group the trainer runs
    in when nothing launched it (rank 0 of 1 on this host; `local_rank` = the GPU index DeepSpeed puts its
    engine on, that of engines.device); variables already set are kept."""
    defaults = {
        "RANK": "0",
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return {k: v for k, v in defaults.items() if k not in environ}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
