"""Full weights on several training ranks: FSDP2 (`torch.distributed.fsdp.fully_shard`), `Steps` of
infra/trainer.py for `model.weights=full` with `engines.train_ranks` > 1.

Each rank shards a copy of the acting agent's model over the update's process group, one FSDP unit per
decoder layer plus the root (embeddings, final norm, head): a rank holds 1/N of the weights, their
gradients and their AdamW moments, and all-gathers a layer's weights only for its forward and backward.
Gradients are summed over the ranks, not averaged: each rank's loss is already its share of the
minibatch's token mean (`accumulate`), as with the replicated LoRA ranks.

The team's own copy of the weights stays whole, for generation, and untouched until the update ends,
when the trained weights are gathered into it: a refused update, or one that fails before that gather,
leaves it as it was (one that fails during the gather leaves it part-written, and the update marked it
changed (`TeamPolicy.changing`), so its next use reloads the checkpoint). The AdamW moments are gathered
too, kept on rank 0 only and saved whole, in the one-rank trainer's layout, so a run may change its number
of ranks (or go back to one) between updates.
"""

from __future__ import annotations

import copy
import math

import torch

from infra.trainer import TorchSteps, TrainSpec


def shard(model: torch.nn.Module, world: int, device: str) -> torch.nn.Module:
    """`model` under FSDP2 over `world` ranks of the default process group, in place: one unit per module
    whose class the model declares unsplittable (a Hugging Face model's decoder layers), and the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (world,))
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for m in reversed(list(model.modules())):  # FSDP2 wraps inner units before the units that hold them
        if type(m).__name__ in blocks:
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # a sum over ranks: see the module docstring
            m.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def _whole(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


class ShardedSteps(TorchSteps):
    """AdamW on this rank's shard of a sharded copy of the agent's full weights (see the module docstring)."""

    lockstep = True  # FSDP's collectives run inside every forward and backward

    def __init__(self, policy, agent: str, spec: TrainSpec):
        self.spec, self.pad = spec, policy.tokenizer.pad_token_id
        with policy.acting(agent) as live_model:
            self.model = shard(copy.deepcopy(live_model), spec.world, policy.device)
        self.live = policy.parameters(agent)
        self.params = list(self.model.parameters())  # the deep copy keeps the order: params[i] shards live[i]
        self.opt = torch.optim.AdamW(self.params, lr=spec.lr, weight_decay=spec.weight_decay)
        self._load(spec.optimizer_state)

    def _set_state(self, state: dict) -> None:
        """Load a whole (one-rank layout) optimizer state: each rank keeps its shard of every moment."""
        from torch.distributed.tensor import distribute_tensor

        def local(v, p):
            if v.shape != p.shape:  # AdamW's step count
                return v
            return distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)

        moments = {i: {k: local(v, self.params[i]) for k, v in s.items()} for i, s in state["state"].items()}
        self.opt.load_state_dict(state | {"state": moments})

    def step(self) -> float:
        gnorm = float(_whole(torch.nn.utils.clip_grad_norm_(self.params, self.spec.max_grad_norm)))
        if math.isfinite(gnorm):
            self.opt.step()
        return gnorm

    def close(self) -> None:
        pass  # no acting block stays open: the update trains its own sharded copy

    def restore(self) -> None:
        pass  # only the shards changed; the team's weights are written by `state`, at the update's end

    def state(self) -> dict:
        """Gather the trained weights into the team's copy and return the whole optimizer state. Every rank
        takes part in each gather; only rank 0 keeps what it gathers (the helpers' results are discarded), so
        a helper never holds the whole moments."""
        keep = self.spec.rank == 0
        with torch.no_grad():
            for live, p in zip(self.live, self.params):
                whole = _whole(p.detach())
                if keep:
                    live.copy_(whole)
        state = self.opt.state_dict()
        moments = {}
        for i, s in state["state"].items():
            gathered = {k: _whole(v) for k, v in s.items()}
            if keep:
                moments[i] = gathered
        return state | {"state": moments}
