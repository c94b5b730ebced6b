"""The `deepspeed` trainer: the torch trainer's update (same loss function, same token-share weighted
micro-batches, same AdamW, same clipping, same early stop and non-finite refusal) with DeepSpeed's
engine doing backward and step under ZeRO (infra/engines/zero.py builds its config).

What ZeRO partitions is the acting agent's trainable weights, their gradients and AdamW state: a
per-update engine wraps exactly those parameters (`_AgentModule`), so one agent's step never touches
another agent's weights or moments, and the frozen base shared by every agent and by the reference
pass stays whole. With LoRA that is little (ZeRO-3 leaves matrices under
`param_persistence_threshold` elements unpartitioned); with `model.weights=full` it is the agent's
whole model. Engines are built per update and destroyed after it, so DeepSpeed's fp32 master copy is
always rebuilt from the weights as they are (after a trust-region backtrack, a checkpoint load, a
resume); only the AdamW moments carry over, saved with the checkpoint like the torch trainer's.

ZeRO-3 leaves large parameters partitioned after the engine is gone: the trainer installs
`TeamPolicy.gather`, so generation, scoring, trust-region backtracking and checkpoints gather them
(`TeamPolicy.materialized`).

The run's process is one rank (rank 0 of 1, on `engines.device`) unless a launcher set the
torch.distributed variables. deepspeed is imported when an update runs, never on import.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from infra.engines.zero import build_zero_config, free_port, single_process_env
from infra.generation import response_logprobs
from infra.trainer import TrainItem, TrainResult, accumulate, minibatches

FORMAT = "deepspeed"


class _AgentModule(torch.nn.Module):
    """The module DeepSpeed wraps: the agent's trainable parameters registered directly (the very
    Parameter objects of the team's model, so ZeRO-3's hooks on this module gather them for its
    forward and backward), and a forward that scores responses with the agent's policy."""

    def __init__(self, policy, agent: str, temperature: float):
        super().__init__()
        for i, p in enumerate(policy.parameters(agent)):
            self.register_parameter(f"w{i:05d}", p)
        self._policy, self._agent, self._temperature = policy, agent, temperature  # plain attributes

    def forward(self, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        with self._policy.acting(self._agent) as model:
            return response_logprobs(model, prompts, responses, self._policy.tokenizer.pad_token_id, self._temperature)


@contextmanager
def gather_partitioned(params: list, modify: bool):
    """Make ZeRO-3-partitioned parameters whole for the block; already whole ones (inside the engine's
    forward, or never partitioned) are left alone, so this nests."""
    from deepspeed import zero
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    todo = [p for p in params if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
    if not todo:
        yield
        return
    # modifier_rank=0 also when only reading: it is what makes DeepSpeed free the gathered copy on exit
    with zero.GatheredParameters(todo, modifier_rank=0):
        yield


def _init_distributed(device: str) -> None:
    import os

    import deepspeed

    index = int(device.split(":")[1]) if ":" in device else 0
    os.environ.update(single_process_env(os.environ, free_port(), local_rank=index))
    if int(os.environ["WORLD_SIZE"]) != 1:
        raise RuntimeError(
            "the deepspeed trainer runs in the flow's own process (one rank); several ranks "
            f"(WORLD_SIZE={os.environ['WORLD_SIZE']}) are not supported yet"
        )
    if int(os.environ["LOCAL_RANK"]) != index:
        raise RuntimeError(
            f"LOCAL_RANK={os.environ['LOCAL_RANK']} but engines.device={device}: DeepSpeed would "
            "move the trained weights to another GPU than the model's"
        )
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


@contextmanager
def optimizer_view(ds_optimizer):
    """The torch AdamW inside DeepSpeed's optimizer wrapper (the wrapper itself at stage 0 in fp32), its
    param groups holding the flat fp32 partitions it steps: ZeRO-3 keeps them empty between steps and
    fills them for its own checkpoints, so does this, for `state_dict` / `load_state_dict`."""
    inner = getattr(ds_optimizer, "optimizer", ds_optimizer)
    fill = getattr(ds_optimizer, "_set_fp32_optimizer_param_groups", None)
    clear = getattr(ds_optimizer, "_clear_fp32_optimizer_param_groups", None)
    if fill is None or clear is None:
        yield inner
        return
    fill()
    try:
        yield inner
    finally:
        clear()


def _layout(inner) -> list[list[int]]:
    return [[int(p.numel()) for p in g["params"]] for g in inner.param_groups]


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


class DeepSpeedTrainer:
    name = "deepspeed"

    def __init__(self, engines):
        self.engines = engines
        self.cfg = engines.deepspeed

    def _load_moments(self, ds_optimizer, path: Path | None) -> None:
        """The AdamW moments saved with the checkpoint the update starts from (not DeepSpeed's master
        weights: those are rebuilt from the weights as they are)."""
        if path is None or not path.exists():
            return
        saved = torch.load(path, weights_only=True)
        with optimizer_view(ds_optimizer) as inner:
            why = None
            if saved.get("trainer") != FORMAT:
                why = "was written by the torch trainer"
            elif saved.get("zero_stage") != self.cfg.zero_stage or saved.get("layout") != _layout(inner):
                why = "has another ZeRO stage or parameter layout"
            if why:
                warnings.warn(
                    f"{path} {why}; the deepspeed trainer starts with fresh AdamW moments", RuntimeWarning, stacklevel=3
                )
                return
            inner.load_state_dict(saved["state"])

    def _moments(self, ds_optimizer) -> dict:
        with optimizer_view(ds_optimizer) as inner:
            return {
                "trainer": FORMAT,
                "zero_stage": self.cfg.zero_stage,
                "layout": _layout(inner),
                "state": _to_cpu(inner.state_dict()),
            }

    def train(
        self,
        policy,
        agent: str,
        items: list[TrainItem],
        loss_fn: Callable,
        *,
        lr: float,
        weight_decay: float,
        epochs: int,
        minibatch_size: int,
        max_grad_norm: float,
        seed: int,
        optimizer_state: Path | None = None,
        temperature: float = 1.0,
        micro_batch_size: int = 2,
        kl_stop: float | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> tuple[TrainResult, dict | None]:
        """infra.trainer.train_agent's contract; the returned optimizer state is this trainer's format."""
        import deepspeed

        t0 = time.perf_counter()
        _init_distributed(self.engines.device)
        policy.gather = gather_partitioned
        params = policy.parameters(agent)
        with policy.materialized(agent):
            backup = [p.detach().clone() for p in params]
        for p in params:  # gradients left by earlier work on these weights must not enter the first step
            p.grad = None
        bf16 = all(p.dtype == torch.bfloat16 for p in params)
        module = _AgentModule(policy, agent, temperature)
        opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
        config = build_zero_config(self.cfg, micro_batch_size=micro_batch_size, max_grad_norm=max_grad_norm, bf16=bf16)
        engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=config)

        def restore(what: str) -> tuple[TrainResult, None]:
            with torch.no_grad(), policy.materialized(agent, modify=True):
                for p, b in zip(params, backup):
                    p.copy_(b)
            return TrainResult(
                float("nan"),
                tokens,
                time.perf_counter() - t0,
                True,
                f"non-finite {what}; update skipped, weights restored",
                {},
            ), None

        def forward(micro, last):
            engine.set_gradient_accumulation_boundary(last)
            return engine([it.prompt_ids for it in micro], [it.response_ids for it in micro])

        losses, stats_acc, tokens, stopped = [], {}, 0, False
        try:
            self._load_moments(engine.optimizer, optimizer_state)
            for mb in minibatches(items, epochs, minibatch_size, seed):
                loss_sum, stats_sum = accumulate(mb, micro_batch_size, forward, loss_fn, engine.backward)
                if not math.isfinite(loss_sum):
                    return restore("loss")
                if kl_stop is not None and stats_sum.get("kl", 0.0) > kl_stop:
                    stopped = True
                    break
                engine.step()  # clips to gradient_clipping, then AdamW
                gnorm = engine.get_global_grad_norm()  # None where DeepSpeed did not compute it
                if gnorm is not None and not math.isfinite(float(gnorm)):
                    return restore("gradient norm")  # the torch trainer refuses before the step
                if on_step:
                    on_step()
                losses.append(loss_sum)
                tokens += int(sum(sum(it.mask) for it in mb))
                step_stats = stats_sum | ({} if gnorm is None else {"grad_norm": float(gnorm)})
                for k, v in step_stats.items():
                    stats_acc.setdefault(k, []).append(v)
            state = self._moments(engine.optimizer)
        finally:
            engine.destroy()
            engine = None  # drops the last reference to the engine and its buffers
        stats = {k: float(np.mean(v)) for k, v in stats_acc.items()} | {"early_stopped": float(stopped)}
        return TrainResult(
            float(np.mean(losses)) if losses else 0.0, tokens, time.perf_counter() - t0, False, "", stats
        ), state
