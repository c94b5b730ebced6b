"""The trainer loop: minibatched gradient steps on one agent's weights with a given loss function, the
same for every trainer engine, which supplies only its forward / backward / step / state hooks (`Steps`:
`TorchSteps` here, DeepSpeed's in infra/engines/deepspeed.py).

The loss math lives in `tasks/losses.py`; this module only moves data, steps the optimiser, clips
gradients, refuses non-finite steps, and keeps the optimiser state with the checkpoint.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from infra.generation import response_logprobs


@dataclass
class TrainItem:
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    mask: list[int]
    ref_logprobs: list[float] | None = None  # the reference policy's, for a loss with a KL term to it


@dataclass
class TrainResult:
    loss: float
    tokens: int
    seconds: float
    skipped: bool
    reason: str
    stats: dict[str, float]
    # the trained tokens each rank's own forward passes covered, rank 0 first: with N ranks, each about 1/N
    rank_tokens: tuple[int, ...] = ()


def _pad(rows: Sequence[Sequence[float]], n: int, dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), n), dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def micro_tensors(micro: list[TrainItem], n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old log-probs, advantages, loss mask) of a micro-batch, each padded to [B, n] on `device`."""
    return (
        _pad([it.old_logprobs for it in micro], n, torch.float32).to(device),
        _pad([it.advantages for it in micro], n, torch.float32).to(device),
        _pad([it.mask for it in micro], n, torch.float32).to(device),
    )


def ref_tensor(micro: list[TrainItem], n: int, device) -> torch.Tensor | None:
    """The micro-batch's reference log-probs padded to [B, n] on `device`; None when no item has them."""
    refs = [it.ref_logprobs for it in micro if it.ref_logprobs is not None]
    if not refs:
        return None
    if len(refs) < len(micro):
        raise ValueError("a micro-batch mixes samples with and without reference log-probs")
    return _pad(refs, n, torch.float32).to(device)


def minibatches(items: list[TrainItem], epochs: int, minibatch_size: int, seed: int):
    """Each epoch, a seeded permutation of `items` cut into minibatches (one optimizer step each)."""
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(items))
        for start in range(0, len(order), minibatch_size):
            yield [items[i] for i in order[start : start + minibatch_size]]


def prompt_order(items: list[TrainItem]) -> list[int]:
    """Indices of `items` with identical prompts made adjacent (groups in order of first appearance), so
    the samples of a group share micro-batches, where their prompt is computed once."""
    first: dict[tuple[int, ...], int] = {}
    for it in items:
        first.setdefault(tuple(it.prompt_ids), len(first))
    return sorted(range(len(items)), key=lambda i: first[tuple(items[i].prompt_ids)])


def by_prompt(items: list[TrainItem]) -> list[TrainItem]:
    return [items[i] for i in prompt_order(items)]


def zero_advantage(it: TrainItem) -> bool:
    """Whether every trained token of `it` has advantage 0 (a NaN counts as non-zero)."""
    return not any(a for a, m in zip(it.advantages, it.mask) if m)


def accumulate(
    mb: list[TrainItem],
    micro_batch_size: int,
    forward: Callable,
    loss_fn: Callable,
    backward: Callable,
    rank: int = 0,
    world: int = 1,
    skip_zero: bool = False,
    lockstep: bool = False,
) -> tuple[float, dict[str, float], int]:
    """One minibatch's gradients, micro-batch by micro-batch: (its loss, its loss stats, the trained tokens
    of this rank's micro-batches).

    `forward(micro, last)` gives the micro-batch's [B, L] log-probs (`last`: the minibatch's final
    micro-batch). Micro-batches bound activation memory; weighting each one's token-mean loss by its
    share of the minibatch's tokens makes the summed gradient the minibatch token-mean's, whatever
    the order, so samples that share a prompt are put together (`by_prompt`). With `world` ranks, rank
    r takes micro-batches r, r + world, ...: its loss, stats and gradients are its part of the sum.
    `lockstep` (an engine with collectives inside forward and backward): every rank makes as many passes,
    a rank short of micro-batches running the first one again with weight 0.

    `skip_zero` (for a loss whose every token term is its advantage times a function of the ratio): the
    samples whose advantages are 0 on every trained token get no forward pass. Their gradient is exactly 0
    and their tokens still count in the minibatch's, so the gradient is the one without skipping; the stats
    are then over the other samples. With none left, one micro-batch still runs, so that the optimizer steps
    on zero gradients as it would have."""
    mb = by_prompt(mb)
    mb_tokens = max(1, sum(sum(it.mask) for it in mb))
    if skip_zero:
        mb = [it for it in mb if not zero_advantage(it)] or mb[:micro_batch_size]
    stats_tokens = max(1, sum(sum(it.mask) for it in mb))
    loss_sum, forwarded = 0.0, 0
    stats_sum: dict[str, float] = {}
    starts = range(0, len(mb), micro_batch_size)
    mine: list[int | None] = list(starts[rank::world])
    if lockstep:
        mine += [None] * (-(-len(starts) // world) - len(mine))
    for m0 in mine:
        micro = mb[(m0 or 0) : (m0 or 0) + micro_batch_size]
        logp = forward(micro, m0 == starts[-1])
        old, adv, mask = micro_tensors(micro, logp.shape[1], logp.device)
        ref = ref_tensor(micro, logp.shape[1], logp.device)
        loss, stats = loss_fn(logp, old, adv, mask) if ref is None else loss_fn(logp, old, adv, mask, ref_logp=ref)
        if m0 is None:  # a lockstep pass: its collectives, no contribution
            backward(loss * 0.0)
            continue
        trained = mask.sum().item()
        share, stats_share = trained / mb_tokens, trained / stats_tokens
        backward(loss * share)
        loss_sum += loss.item() * share
        forwarded += int(trained)
        for k, v in stats.items():
            stats_sum[k] = stats_sum.get(k, 0.0) + v * stats_share
    return loss_sum, stats_sum, forwarded


@dataclass(frozen=True)
class TrainSpec:
    """How one update trains: the algorithm's knobs and the optimizer state it starts from."""

    lr: float
    weight_decay: float
    epochs: int
    minibatch_size: int
    max_grad_norm: float
    seed: int  # the minibatches' order
    optimizer_state: Path | None = None  # AdamW moments saved with the checkpoint the update starts from
    temperature: float = 1.0  # the sampling temperature of the old log-probs
    micro_batch_size: int = 2
    kl_stop: float | None = None  # stop, before its step, at a minibatch whose KL estimate exceeds it
    on_step: Callable[[], None] | None = field(default=None, compare=False)  # after every optimizer step
    rank: int = 0  # this process's rank among `world` training ranks (torch.distributed, infra/ranks.py)
    world: int = 1
    skip_zero_advantage: bool = False  # no forward pass for samples whose advantages are all 0 (`accumulate`)


class Steps(Protocol):
    """What a trainer engine supplies to `train_loop`, built per update of one agent."""

    lockstep: bool  # every rank must make as many forward/backward passes (`accumulate`)

    def forward(self, micro: list[TrainItem], last: bool) -> torch.Tensor:
        """The micro-batch's [B, L] response log-probs under the weights in training (`last`: the
        minibatch's final micro-batch)."""

    def zero_grad(self) -> None:
        """Clear the gradients before a minibatch."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float | None:
        """Clip the minibatch's gradients to max_grad_norm and step; their norm (None where unknown). With
        a non-finite norm the loop ends the update and restores the weights."""

    def restore(self) -> None:
        """Leave the team's weights as they were before the update (put back those the steps changed)."""

    def state(self) -> dict:
        """The optimizer state to save with the new checkpoint."""

    def close(self) -> None: ...


def train_loop(steps: Steps, items: list[TrainItem], loss_fn: Callable, spec: TrainSpec):
    """`spec.epochs` passes of minibatch steps: (TrainResult, the new optimizer state), the state None
    when the update was refused (a non-finite loss or gradient norm; the weights are then restored).

    `kl_stop`: the update ends before the step of a minibatch whose KL estimate (the loss's `kl` stat,
    with the weights so far) exceeds it; `stats['early_stopped']` is then 1. With `spec.world` ranks, each
    runs this loop on the same items: every decision is taken on sums over the ranks, so they stay in step."""
    t0 = time.perf_counter()
    losses: list[float] = []
    stats_acc: dict[str, list[float]] = {}
    tokens, forwarded, stopped = 0, 0, False

    def refused(what: str) -> tuple[TrainResult, None]:
        steps.restore()
        reason = f"non-finite {what}; update skipped, weights restored"
        return TrainResult(float("nan"), tokens, time.perf_counter() - t0, True, reason, {}), None

    try:
        for mb in minibatches(items, spec.epochs, spec.minibatch_size, spec.seed):
            steps.zero_grad()
            loss_sum, stats, mine = accumulate(
                mb,
                spec.micro_batch_size,
                steps.forward,
                loss_fn,
                steps.backward,
                spec.rank,
                spec.world,
                spec.skip_zero_advantage,
                steps.lockstep,
            )
            forwarded += mine
            if spec.world > 1:  # every rank decides on the whole minibatch's loss and KL
                loss_sum, stats = all_sum(loss_sum, stats)
            if not math.isfinite(loss_sum):
                return refused("loss")
            if spec.kl_stop is not None and stats.get("kl", 0.0) > spec.kl_stop:
                stopped = True
                break
            gnorm = steps.step()
            if gnorm is not None and not math.isfinite(gnorm):
                return refused("gradient norm")
            if spec.on_step:
                spec.on_step()
            losses.append(loss_sum)
            tokens += int(sum(sum(it.mask) for it in mb))
            for k, v in (stats | ({} if gnorm is None else {"grad_norm": gnorm})).items():
                stats_acc.setdefault(k, []).append(v)
        rank_tokens = gather_counts(forwarded) if spec.world > 1 else (forwarded,)
        state = steps.state()
    except BaseException:  # a failed update (a rank that died, Ctrl-C) leaves the weights as they were
        steps.restore()
        raise
    finally:
        steps.close()
    stats = {k: float(np.mean(v)) for k, v in stats_acc.items()} | {"early_stopped": float(stopped)}
    loss = float(np.mean(losses)) if losses else 0.0
    return TrainResult(loss, tokens, time.perf_counter() - t0, False, "", stats, rank_tokens), state


def all_sum(loss: float, stats: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The sum over the ranks of each rank's part of a minibatch's loss and stats (a rank without a
    micro-batch has no stats)."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (loss, stats))
    total: dict[str, float] = {}
    for _, st in parts:
        for k, v in st.items():
            total[k] = total.get(k, 0.0) + v
    return float(sum(p[0] for p in parts)), total


def gather_counts(count: int) -> tuple[int, ...]:
    """Every rank's `count`, rank 0 first."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, count)
    return tuple(int(p) for p in parts)


def reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum the ranks' gradients (each rank's part of the token-weighted minibatch loss), so every rank
    clips and steps on the whole minibatch's gradient and the replicas stay identical (DDP's all-reduce,
    once per step rather than per backward: micro-batches accumulate locally first)."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for p, g in zip(params, torch.split(flat, [g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


class TorchSteps:
    """The `torch` engine's steps: AdamW on the agent's trainable parameters, in this process (replicated
    on every rank; full weights on several ranks are sharded instead: infra/sharded.py)."""

    lockstep = False

    def __init__(self, policy, agent: str, spec: TrainSpec):
        self.spec, self.pad = spec, policy.tokenizer.pad_token_id
        self.params = policy.parameters(agent)
        self.opt = torch.optim.AdamW(self.params, lr=spec.lr, weight_decay=spec.weight_decay)
        self._load(spec.optimizer_state)
        self.backup = [p.detach().clone() for p in self.params]
        self._acting = ExitStack()
        self.model = self._acting.enter_context(policy.acting(agent))

    def _load(self, path: Path | None) -> None:
        if path is None or not path.exists():
            return
        # mapped, not read: a sharded rank touches only its own slice of each moment (infra/sharded.py)
        state = torch.load(path, weights_only=True, mmap=True)
        if "trainer" in state:  # written by another trainer (infra/engines/deepspeed.py): its layout is not ours
            warnings.warn(
                f"{path} holds {state['trainer']} optimizer state; the torch trainer starts with fresh AdamW moments",
                RuntimeWarning,
                stacklevel=4,
            )
        else:
            self._set_state(state)
            for g in self.opt.param_groups:  # the spec's hyperparameters, not the saved ones
                g["lr"], g["weight_decay"] = self.spec.lr, self.spec.weight_decay

    def _set_state(self, state: dict) -> None:
        self.opt.load_state_dict(state)

    def forward(self, micro: list[TrainItem], last: bool) -> torch.Tensor:
        prompts, responses = [it.prompt_ids for it in micro], [it.response_ids for it in micro]
        return response_logprobs(self.model, prompts, responses, self.pad, self.spec.temperature)

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        if self.spec.world > 1:
            reduce_gradients(self.params)
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.spec.max_grad_norm).item()
        if math.isfinite(gnorm):
            self.opt.step()
        return gnorm

    def restore(self) -> None:
        with torch.no_grad():
            for p, b in zip(self.params, self.backup):
                p.copy_(b)

    def state(self) -> dict:
        return self.opt.state_dict()

    def close(self) -> None:
        self._acting.close()


def batch_logprobs(
    policy, agent: str, items: list[TrainItem], temperature: float = 1.0, micro_batch_size: int = 2
) -> tuple[torch.Tensor, ...]:
    """(new log-probs under the agent's current weights, old log-probs, advantages, mask), each padded
    to one [B, L] tensor; no gradient."""
    n = max(1, max(len(it.response_ids) for it in items))
    pad = policy.tokenizer.pad_token_id
    new = torch.zeros((len(items), n))
    order = prompt_order(items)
    with torch.no_grad(), policy.acting(agent) as model:
        for m0 in range(0, len(items), micro_batch_size):
            idx = order[m0 : m0 + micro_batch_size]
            logp = response_logprobs(
                model, [items[i].prompt_ids for i in idx], [items[i].response_ids for i in idx], pad, temperature
            )
            new[idx, : logp.shape[1]] = logp.cpu()
    return (
        new,
        _pad([it.old_logprobs for it in items], n, torch.float32),
        _pad([it.advantages for it in items], n, torch.float32),
        _pad([it.mask for it in items], n, torch.float32),
    )


def interpolate(params: list[torch.Tensor], start: list[torch.Tensor], end: list[torch.Tensor], alpha: float) -> None:
    """params <- start + alpha * (end - start): a backtracking line search's step."""
    with torch.no_grad():
        for p, a, b in zip(params, start, end):
            p.copy_(a + alpha * (b - a))
