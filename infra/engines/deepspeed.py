"""The `deepspeed` trainer: the one trainer loop (infra/trainer.py `train_loop`: the same loss function,
token-share weighted micro-batches, early stop and non-finite refusal as the torch trainer) with
DeepSpeed's engine doing forward, backward and step (AdamW, clipping) under ZeRO (infra/engines/zero.py
builds its config).

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
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from infra.engines.zero import build_zero_config, free_port, single_process_env
from infra.generation import response_logprobs
from infra.trainer import TrainItem, TrainResult, TrainSpec, train_loop

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
        self, policy, agent: str, items: list[TrainItem], loss_fn: Callable, spec: TrainSpec
    ) -> tuple[TrainResult, dict | None]:
        """infra.trainer.train_loop over DeepSpeed's steps; the optimizer state returned is this trainer's format."""
        return train_loop(_DeepSpeedSteps(self, policy, agent, spec), items, loss_fn, spec)


class _DeepSpeedSteps:
    """One update's DeepSpeed engine over the agent's trainable weights (`Steps` of infra/trainer.py)."""

    lockstep = False  # one rank (engines.train_ranks > 1 runs the torch trainer only)

    def __init__(self, trainer: DeepSpeedTrainer, policy, agent: str, spec: TrainSpec):
        import deepspeed

        _init_distributed(trainer.engines.device)
        policy.gather = gather_partitioned
        self.trainer, self.policy, self.agent = trainer, policy, agent
        self.params = policy.parameters(agent)
        with policy.materialized(agent):
            self.backup = [p.detach().clone() for p in self.params]
        for p in self.params:  # gradients left by earlier work on these weights must not enter the first step
            p.grad = None
        bf16 = all(p.dtype == torch.bfloat16 for p in self.params)
        module = _AgentModule(policy, agent, spec.temperature)
        opt = torch.optim.AdamW(module.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
        config = build_zero_config(
            trainer.cfg, micro_batch_size=spec.micro_batch_size, max_grad_norm=spec.max_grad_norm, bf16=bf16
        )
        self.engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=config)
        # At ZeRO stage 0 in fp32 DeepSpeed steps our AdamW unwrapped: it clips the gradients but keeps no
        # norm (get_global_grad_norm() stays None; only its ZeRO, fp16 and bf16 optimizers measure one) and
        # steps on a non-finite gradient too. There `step` measures and clips them itself, as the torch trainer.
        self.clip_here = spec.max_grad_norm if self.engine.optimizer is opt else None
        try:
            trainer._load_moments(self.engine.optimizer, spec.optimizer_state)
        except BaseException:
            self.close()
            raise

    def forward(self, micro: list[TrainItem], last: bool) -> torch.Tensor:
        self.engine.set_gradient_accumulation_boundary(last)
        return self.engine([it.prompt_ids for it in micro], [it.response_ids for it in micro])

    def zero_grad(self) -> None:
        pass  # the engine's step clears them

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> float | None:
        if self.clip_here is not None:
            gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_here).item()
            if not math.isfinite(gnorm):  # no step: the loop refuses the update and restores the weights
                for p in self.params:
                    p.grad = None
                return gnorm
            self.engine.step()  # its own clipping finds them within max_grad_norm already
            return gnorm
        self.engine.step()  # clips to gradient_clipping, then AdamW, then clears the gradients
        gnorm = self.engine.get_global_grad_norm()  # its optimizer's (a tensor under ZeRO-3), None if it keeps none
        return None if gnorm is None else float(gnorm)

    def restore(self) -> None:
        with torch.no_grad(), self.policy.materialized(self.agent, modify=True):
            for p, b in zip(self.params, self.backup):
                p.copy_(b)

    def state(self) -> dict:
        return self.trainer._moments(self.engine.optimizer)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.destroy()
            self.engine = None  # drops the last reference to the engine and its buffers
