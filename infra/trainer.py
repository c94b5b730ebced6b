"""The torch trainer (the `torch` engine): minibatched gradient steps on one agent's weights with a given loss function.

The loss math lives in `tasks/losses.py`; this module only moves data, steps the optimiser, clips
gradients, refuses non-finite steps, and keeps the optimiser state with the checkpoint.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class TrainResult:
    loss: float
    tokens: int
    seconds: float
    skipped: bool
    reason: str
    stats: dict[str, float]


def _pad(rows: list[list[float]], n: int, dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), n), dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def micro_tensors(micro: list[TrainItem], n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old log-probs, advantages, loss mask) of a micro-batch, each padded to [B, n] on `device`."""
    return tuple(
        _pad(rows, n, torch.float32).to(device)
        for rows in ([it.old_logprobs for it in micro], [it.advantages for it in micro], [it.mask for it in micro])
    )


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


def accumulate(
    mb: list[TrainItem], micro_batch_size: int, forward: Callable, loss_fn: Callable, backward: Callable
) -> tuple[float, dict[str, float]]:
    """One minibatch's gradients, micro-batch by micro-batch: (its loss, its loss stats).

    `forward(micro, last)` gives the micro-batch's [B, L] log-probs (`last`: the minibatch's final
    micro-batch). Micro-batches bound activation memory; weighting each one's token-mean loss by its
    share of the minibatch's tokens makes the summed gradient the minibatch token-mean's, whatever
    the order, so samples that share a prompt are put together (`by_prompt`)."""
    mb = by_prompt(mb)
    mb_tokens = max(1, sum(sum(it.mask) for it in mb))
    loss_sum, stats_sum = 0.0, {}
    starts = range(0, len(mb), micro_batch_size)
    for m0 in starts:
        micro = mb[m0 : m0 + micro_batch_size]
        logp = forward(micro, m0 == starts[-1])
        old, adv, mask = micro_tensors(micro, logp.shape[1], logp.device)
        loss, stats = loss_fn(logp, old, adv, mask)
        share = mask.sum().item() / mb_tokens
        backward(loss * share)
        loss_sum += loss.item() * share
        for k, v in stats.items():
            stats_sum[k] = stats_sum.get(k, 0.0) + v * share
    return loss_sum, stats_sum


def train_agent(
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
    """Run `epochs` passes of minibatch steps. Returns the result and the new optimiser state
    (None when the update was skipped: weights are then restored to what they were).

    `kl_stop`: stop early, before the step, once a minibatch's KL estimate (the loss's `kl` stat,
    measured with the weights so far) exceeds it; `stats['early_stopped']` is then 1."""
    t0 = time.perf_counter()
    params = policy.parameters(agent)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if optimizer_state is not None and optimizer_state.exists():
        state = torch.load(optimizer_state, weights_only=True)
        if "trainer" in state:  # written by another trainer (infra/engines/deepspeed.py): its layout is not ours
            warnings.warn(
                f"{optimizer_state} holds {state['trainer']} optimizer state; the torch trainer "
                "starts with fresh AdamW moments",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            opt.load_state_dict(state)
    backup = [p.detach().clone() for p in params]
    pad = policy.tokenizer.pad_token_id
    losses, stats_acc, tokens, stopped = [], {}, 0, False
    with policy.acting(agent) as model:

        def forward(micro, last):
            return response_logprobs(
                model, [it.prompt_ids for it in micro], [it.response_ids for it in micro], pad, temperature
            )

        for mb in minibatches(items, epochs, minibatch_size, seed):
            opt.zero_grad(set_to_none=True)
            loss_sum, stats = accumulate(mb, micro_batch_size, forward, loss_fn, torch.Tensor.backward)
            gnorm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            if not (math.isfinite(loss_sum) and math.isfinite(gnorm.item())):
                with torch.no_grad():
                    for p, b in zip(params, backup):
                        p.copy_(b)
                what = "loss" if not math.isfinite(loss_sum) else "gradient norm"
                return TrainResult(
                    float("nan"),
                    tokens,
                    time.perf_counter() - t0,
                    True,
                    f"non-finite {what}; update skipped, weights restored",
                    {},
                ), None
            if kl_stop is not None and stats.get("kl", 0.0) > kl_stop:
                stopped = True
                break
            opt.step()
            if on_step:
                on_step()
            losses.append(loss_sum)
            tokens += int(sum(sum(it.mask) for it in mb))
            for k, v in (stats | {"grad_norm": gnorm.item()}).items():
                stats_acc.setdefault(k, []).append(v)
    stats = {k: float(np.mean(v)) for k, v in stats_acc.items()} | {"early_stopped": float(stopped)}
    return TrainResult(
        float(np.mean(losses)) if losses else 0.0, tokens, time.perf_counter() - t0, False, "", stats
    ), opt.state_dict()


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
