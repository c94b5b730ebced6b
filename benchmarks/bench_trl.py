"""One GRPO training step, teamrl vs TRL's GRPOTrainer, on the CPU.

Command: `.venv/bin/python -m benchmarks.bench_trl` (SmolLM2-135M-Instruct, 2 prompts x G=4, 32 new
tokens, 3 timed steps per side; `--quick`: the `tiny` model, 8 tokens, one timed step). Needs TRL:
`pip install -e '.[bench]'`.

A step on each side: sample a group of G completions for each of P chat prompts, score them with the
same deterministic reward (the completion's word count), group-normalise the rewards into advantages,
and take one optimiser step of the PPO-clip loss over all P * G completions, in micro-batches of
`AlgorithmConfig().micro_batch_size` with gradients accumulated (TRL: `per_device_train_batch_size` =
that micro-batch, `gradient_accumulation_steps` = the rest). Ours is teamrl's own code path:
`infra.generation.generate` on `TeamPolicy.acting`, the `grpo` estimator of tasks/advantages.py, and
`infra.engines.torch.train_agent` with `tasks.losses.ppo_clip_loss`, as tasks/update.py calls them.

Matched: the same base weights (two instances built by infra/models.py), the same LoRA config (ours,
handed to TRL as `peft_config`), prompts (identical token ids), G, max new tokens, temperature with
no top-k / top-p, stop token, learning rate, clip epsilon, gradient-norm clip, torch AdamW (not the
fused one), a constant learning rate, fp32, no gradient checkpointing (TRL's default turns it on),
no reference model (beta = 0; ours: no KL term) and no extra old-policy forward on either side (ours
keeps the sampling log-probs; TRL, with one iteration per generation, uses the detached current ones).
Each side's median is over steps after a warm-up step; TRL's step is timed from `on_step_begin` to
`on_step_end` (its construction, data loading and logging are not in it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from copy import deepcopy
from functools import partial

import numpy as np
import torch

from benchmarks.common import Section, Target, machine, median_seconds
from infra.engines.torch import train_agent
from infra.generation import encode_chat, generate
from infra.models import ModelConfig, load_base
from infra.policy import TeamPolicy
from infra.trainer import TrainItem, TrainSpec
from tasks.advantages import Sample, estimate
from tasks.algorithm import AlgorithmConfig
from tasks.losses import ppo_clip_loss

COMMAND = ".venv/bin/python -m benchmarks.bench_trl"
PROMPTS = [
    "Write a short story about a cat who learns to swim.",
    "Explain how a bicycle works to a child.",
    "Describe your favourite city and why you like it.",
    "List some tips for staying focused while studying.",
]
TEMPERATURE = 1.0


def reward(text: str) -> float:
    """The cheap deterministic reward both sides use: the completion's word count."""
    return float(len(text.split()))


def teamrl_step(
    policy: TeamPolicy,
    prompts: list[list[int]],
    group: int,
    max_tokens: int,
    alg: AlgorithmConfig,
    tokens: list[int],
    sampling: list[float],
) -> None:
    """Rollouts, GRPO advantages and one PPO-clip update of the single agent `solver`; the sampling's
    seconds are appended to `sampling`."""
    t0 = time.perf_counter()
    with policy.sampling("solver") as model:
        gens = generate(
            model, policy.tokenizer, [p for p in prompts for _ in range(group)], max_tokens, temperature=TEMPERATURE
        )
    sampling.append(time.perf_counter() - t0)
    samples = [
        Sample(str(i), str(i // group), "solver", 0, np.array(g.logprobs), np.zeros(0), reward(g.text))
        for i, g in enumerate(gens)
    ]
    items = [
        TrainItem(g.prompt_ids, g.response_ids, g.logprobs, a.tolist(), [1] * len(g.response_ids))
        for g, a in zip(gens, estimate("grpo", samples, eps=alg.whiten_eps))
    ]
    train_agent(
        policy,
        "solver",
        items,
        partial(ppo_clip_loss, clip_eps=alg.clip_eps),
        TrainSpec(
            lr=alg.lr,
            weight_decay=alg.weight_decay,
            epochs=1,
            minibatch_size=len(items),
            max_grad_norm=alg.max_grad_norm,
            seed=0,
            temperature=TEMPERATURE,
            micro_batch_size=alg.micro_batch_size,
        ),
    )
    tokens.append(sum(len(g.response_ids) for g in gens))


def trl_steps(
    policy: TeamPolicy, chats: list[list[dict]], group: int, max_tokens: int, alg: AlgorithmConfig, steps: int
) -> tuple[list[float], list[int], str]:
    """Seconds and completion tokens of each of `steps` GRPOTrainer optimiser steps; TRL's version."""
    try:
        import trl
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
    except ImportError as e:
        raise RuntimeError(f"this benchmark needs TRL ({e}): pip install -e '.[bench]'") from e

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            seconds.append(time.perf_counter() - self.t0)

    def word_count(completions, completion_ids, **_):
        tokens.append(sum(map(len, completion_ids)))
        return [reward(c[0]["content"]) for c in completions]

    seconds, tokens = [], []
    batch = len(chats) * group
    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            seed=0,
            max_steps=steps,
            per_device_train_batch_size=alg.micro_batch_size,
            gradient_accumulation_steps=batch // alg.micro_batch_size,
            num_generations=group,
            max_completion_length=max_tokens,
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            epsilon=alg.clip_eps,
            learning_rate=alg.lr,
            weight_decay=alg.weight_decay,
            max_grad_norm=alg.max_grad_norm,
            optim="adamw_torch",
            lr_scheduler_type="constant",
            loss_type="dapo",
            report_to=[],
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = trl.GRPOTrainer(
            model=load_base(policy.cfg, policy.tokenizer),
            reward_funcs=word_count,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": chats}),
            processing_class=policy.tokenizer,
            peft_config=deepcopy(policy.model.peft_config["solver"]),
            callbacks=[StepTimer()],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training metrics
        trainer.train()
    return seconds, tokens, trl.__version__


def run(quick: bool = False) -> Section:
    model, prompts, group, max_tokens, repeats = (
        ("tiny", 2, 4, 8, 1) if quick else ("smollm2-135m-instruct", 2, 4, 32, 3)
    )
    alg = AlgorithmConfig()
    chats = [[{"role": "user", "content": p}] for p in PROMPTS[:prompts]]
    torch.manual_seed(0)
    policy = TeamPolicy(ModelConfig(name=model), ["solver"])
    prompt_ids = [encode_chat(policy.tokenizer, c) for c in chats]

    ours_tokens: list[int] = []
    sampling: list[float] = []
    ours = median_seconds(
        lambda: teamrl_step(policy, prompt_ids, group, max_tokens, alg, ours_tokens, sampling), repeats
    )
    trl_seconds, trl_tokens, version = trl_steps(policy, chats, group, max_tokens, alg, 1 + repeats)
    theirs = statistics.median(trl_seconds[1:])

    def row(name: str, seconds: float, tokens: list[int]) -> dict:
        per_step = statistics.mean(tokens[1:])
        return {
            "trainer": name,
            "median s / step": seconds,
            "completion tokens / step": per_step,
            "completion tokens/s": per_step / seconds,
        }

    setup = (
        f"Model `{model}` with LoRA r={policy.cfg.lora_rank} on all linear layers, {prompts} chat prompts x "
        f"G={group} samples, up to {max_tokens} new tokens, temperature {TEMPERATURE}; one optimiser step over "
        f"the {prompts * group} completions in micro-batches of {alg.micro_batch_size}; median of {repeats} "
        f"step(s) after a warm-up step, ours then TRL's in one process. Machine: {machine()}."
    )
    split = (
        f"Of teamrl's step, sampling took {statistics.median(sampling[1:]):.2f} s (median), the rest is "
        "advantages and the update."
    )
    lengths = (
        "Both sides sample, so completion lengths can differ (an EOS ends a completion early): compare "
        "tokens/s as well as seconds per step."
    )
    unmatched = (
        "Not matched: ours samples with the LoRA adapter folded into the base weights "
        "(TeamPolicy.sampling) and draws each token by inverse CDF, TRL runs the adapter beside every "
        "layer and draws with torch.multinomial (the same distribution either way); ours runs the prompt a "
        "micro-batch's samples share once, with their completions "
        "packed after it (infra/generation.response_logits); TRL runs prompt + completion per sample. "
        "TRL scores with a fused, tiled LM head (no full logits), also computes each token's "
        "entropy and its per-step metrics, and keeps one AdamW across steps; `train_agent` builds a fresh "
        "AdamW per update (a teamrl run reloads its moments from the checkpoint: that I/O, the checkpoint "
        "write and the rollout bookkeeping are not timed); ours runs the model in eval mode, TRL in train "
        "mode (this model has no dropout)."
    )
    return Section(
        title="GRPO training step: teamrl vs TRL GRPOTrainer (CPU)",
        command=COMMAND + (" --quick" if quick else ""),
        rows=[row("teamrl", ours, ours_tokens), row(f"TRL {version}", theirs, trl_tokens)],
        targets=[Target("teamrl / TRL seconds per step", ours / theirs, at_most=0.8)],
        notes=[setup, split, lengths, unmatched],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, a few tokens, one timed step")
    print(run(parser.parse_args().quick).markdown())
