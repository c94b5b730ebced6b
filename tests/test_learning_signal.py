"""REINFORCE++ on the tiny model raises a toy reward over 20 seeded updates.

Toy reward: the fraction of response tokens that belong to S, the 50 tokens the untrained model
samples most often for these prompts. The untrained model hits S rarely; learning must raise it.
"""

from collections import Counter
from functools import partial

import numpy as np
import torch

from infra.engines.torch import train_agent
from infra.generation import encode_chat, generate, score_logprobs
from infra.models import ModelConfig
from infra.policy import TeamPolicy
from infra.trainer import TrainItem, TrainSpec
from tasks.advantages import Sample, estimate
from tasks.losses import ppo_clip_loss


def test_reinforce_pp_raises_mean_reward():
    policy = TeamPolicy(ModelConfig(name="tiny", lora_rank=8, lora_alpha=16, tiny_init_std=0.2), ["a"], seed=0)
    tok = policy.tokenizer
    prompts = [encode_chat(tok, [{"role": "user", "content": f"Say something {i}"}]) for i in range(8)]
    torch.manual_seed(123)
    with policy.acting("a") as m:
        first = generate(m, tok, prompts * 8, 8)
    target = {t for t, _ in Counter(t for g in first for t in g.response_ids).most_common(50)}

    mean_rewards = []
    for step in range(20):
        torch.manual_seed(step)
        with policy.acting("a") as m:
            gens = generate(m, tok, prompts * 2, 8)
        with policy.reference() as m:
            refs = score_logprobs(m, [g.prompt_ids for g in gens], [g.response_ids for g in gens], tok.pad_token_id)
        rewards = [float(np.mean([t in target for t in g.response_ids])) for g in gens]
        mean_rewards.append(np.mean(rewards))
        samples = [
            Sample(str(i), str(i % 8), "a", 0, np.array(g.logprobs), np.array(r), s)
            for i, (g, r, s) in enumerate(zip(gens, refs, rewards))
        ]
        advs = estimate("reinforce_pp", samples, beta=0.01)
        items = [
            TrainItem(g.prompt_ids, g.response_ids, g.logprobs, a.tolist(), [1] * len(g.response_ids))
            for g, a in zip(gens, advs)
        ]
        res, _ = train_agent(
            policy,
            "a",
            items,
            partial(ppo_clip_loss, clip_eps=0.2),
            # a larger step makes the tiny random model deterministic within a few updates: every sample then
            # scores alike, advantages vanish and the curve stalls, or falls to 0 when no sample hits S
            TrainSpec(lr=1e-3, weight_decay=0.0, epochs=1, minibatch_size=16, max_grad_norm=1.0, seed=step),
        )
        assert not res.skipped
    early, late = np.mean(mean_rewards[:3]), np.median(mean_rewards[-5:])
    assert late > early + 0.05, f"reward did not rise: {np.round(mean_rewards, 3)}"
