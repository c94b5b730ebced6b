"""Generation throughput and training-step MFU on this CPU.

    .venv/bin/python -m benchmarks.bench_generation [--quick]

1. Tokens/s of the `hf` engine's batched generate (infra/generation.py: prompts sorted by length and
   left-padded, `batch_size` per call) against the naive loop, `model.generate` on one prompt at a
   time. Same prompts (MathChat solver chats), budget and temperature. Both sample, so lengths may
   differ: each side's tokens/s counts the tokens it generated.
2. MFU: the FLOP/s a training step achieves (infra/engines/torch.train_agent, PPO-clip loss, LoRA) divided
   by this machine's matmul peak, measured here (fp32 `torch.matmul`, n = 2048, the same threads).
   FLOPs of a step = 2 * N_body * T_all + 2 * N_head * T_resp for the forward pass (the head only runs
   on response positions), times 2 for LoRA (the backward pass to the activations; the adapters' own
   gradients are negligible) or 3 for full weights. N_body = weights of the decoder's Linear layers,
   N_head = the output projection, T = tokens that are not padding. Attention's L^2 term is left out,
   as in the usual 6ND estimate, so MFU is slightly understated.
3. Prompt sharing: the forward and backward pass of one training micro-batch whose samples share a
   prompt (a GRPO group), with each distinct prompt run once (infra/generation.response_logits: one
   row per distinct prompt, its responses packed after it under a 4D attention mask) vs the prompt
   run once per sample (`share_prompt=False`, what the trainer did before). Two prompt lengths: a
   short chat prompt, and a long multi-agent context.
4. Adapter folding: the engine's batched generate with the agent's LoRA adapter folded into the base
   weights (`TeamPolicy.sampling`, the fold timed with it) vs the adapter computed on the side of every
   layer (`TeamPolicy.acting`). No stop token, so both sides generate every token of the budget.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import Section, Target, median_seconds


def _policy(model: str):
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    return TeamPolicy(ModelConfig(name=model), ["solver"], seed=0)


def _prompts(tokenizer, n: int) -> list[list[int]]:
    from infra.generation import encode_chat
    from pipelines.mathchat import problems

    qs = problems.generate(list(problems.FAMILIES), n, seed=0)
    return [encode_chat(tokenizer, [{"role": "user", "content": f"Solve step by step: {p.question}"}]) for p in qs]


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n fp32 matmul: 2 n^3 / seconds."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / median_seconds(lambda: a @ b, repeats)


def linear_weights(model) -> tuple[int, int]:
    """(N_body, N_head): weights in the decoder's Linear layers (LoRA adapters excluded), and in the head."""
    head = model.get_output_embeddings()
    body = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not head and "lora_" not in name
    )
    return body, head.weight.numel()


def generation(policy, prompts: list[list[int]], max_new: int, batch_size: int, repeats: int) -> list[dict]:
    from infra.generation import generate

    tok, rows = policy.tokenizer, []
    with policy.sampling("solver") as model:

        def batched():
            return generate(model, tok, prompts, max_new, temperature=1.0, batch_size=batch_size)

        def naive():
            return [generate(model, tok, [p], max_new, temperature=1.0, batch_size=1)[0] for p in prompts]

        for name, fn in (("hf engine, batched", batched), ("naive, one prompt per generate", naive)):
            torch.manual_seed(0)
            tokens = sum(len(g.response_ids) for g in fn())
            s = median_seconds(fn, repeats, warmup=0)
            rows.append(
                {"generation": name, "prompts": len(prompts), "tokens": tokens, "median s": s, "tokens/s": tokens / s}
            )
    return rows


def training_mfu(policy, prompts: list[list[int]], resp_len: int, repeats: int) -> dict:
    from infra.engines.torch import train_agent
    from infra.trainer import TrainItem, TrainSpec
    from tasks.losses import ppo_clip_loss

    g = torch.Generator().manual_seed(0)
    vocab = len(policy.tokenizer)
    items = [
        TrainItem(
            p,
            torch.randint(0, vocab, (resp_len,), generator=g).tolist(),
            [-2.0] * resp_len,
            torch.randn(resp_len, generator=g).tolist(),
            [1] * resp_len,
        )
        for p in prompts
    ]

    def step():  # one minibatch = one optimizer step over every item
        train_agent(
            policy,
            "solver",
            items,
            ppo_clip_loss,
            TrainSpec(
                lr=1e-5,
                weight_decay=0.0,
                epochs=1,
                minibatch_size=len(items),
                max_grad_norm=1.0,
                seed=0,
                micro_batch_size=4,
            ),
        )

    s = median_seconds(step, repeats)
    n_body, n_head = linear_weights(policy.model)
    t_all = sum(len(it.prompt_ids) + resp_len for it in items)
    forward = 2 * n_body * t_all + 2 * n_head * resp_len * len(items)
    flops = forward * (2 if policy.cfg.weights == "lora" else 3)
    return {
        "step": f"train_agent, {len(items)} sequences ({t_all} tokens), {policy.cfg.weights}",
        "median s": s,
        "GFLOP": flops / 1e9,
        "GFLOP/s": flops / s / 1e9,
    }


def prompt_sharing(policy, prompt_len: int, resp_len: int, group: int, repeats: int) -> dict:
    """Seconds of a forward + backward pass over `group` responses to one prompt, shared vs not."""
    from infra.generation import response_logprobs

    g = torch.Generator().manual_seed(prompt_len)
    vocab, pad = len(policy.tokenizer), policy.tokenizer.pad_token_id
    prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
    responses = [torch.randint(0, vocab, (resp_len,), generator=g).tolist() for _ in range(group)]
    with policy.acting("solver") as model:

        def step(share: bool):
            response_logprobs(model, [prompt] * group, responses, pad, share_prompt=share).sum().backward()

        shared, each = (median_seconds(lambda: step(share), repeats) for share in (True, False))  # noqa: B023 (timed at once)
    return {
        "micro-batch": f"{group} x ({prompt_len}-token prompt + {resp_len}-token response)",
        "prompt per sample (s)": each,
        "prompt shared (s)": shared,
        "shared / per sample": shared / each,
    }


def adapter_folding(policy, prompts: list[list[int]], max_new: int, repeats: int) -> dict:
    """Seconds of batched generation with the adapter folded into the base weights vs on the side."""
    from infra.generation import generate

    def timed(weights) -> float:
        def once():
            with weights("solver") as model:
                generate(model, policy.tokenizer, prompts, max_new, batch_size=16, stop_ids=[-1])

        return median_seconds(once, repeats)

    folded, side = timed(policy.sampling), timed(policy.acting)
    return {
        "generation": f"{len(prompts)} prompts x {max_new} tokens",
        "adapter on the side (s)": side,
        "adapter folded (s)": folded,
        "folded / on the side": folded / side,
    }


def run(quick: bool = False) -> Section:
    model = "tiny" if quick else "smollm2-135m-instruct"
    n, max_new, repeats = (4, 16, 1) if quick else (16, 64, 3)
    policy = _policy(model)
    prompts = _prompts(policy.tokenizer, n)
    gen = generation(policy, prompts, max_new, batch_size=16, repeats=repeats)
    train = training_mfu(policy, prompts[:8], resp_len=max_new, repeats=repeats)
    sharing = [prompt_sharing(policy, p, 16 if quick else r, 2, repeats) for p, r in ((42, 32), (400, 64))]
    folding = adapter_folding(policy, prompts[:8], max_new // 2, repeats)
    peak = matmul_peak(1024 if quick else 2048, repeats=3 if quick else 10)
    mfu = train["GFLOP/s"] * 1e9 / peak
    rows = [
        {"measure": r["generation"], "median s": r["median s"], "rate": f"{r['tokens/s']:.1f} tokens/s"} for r in gen
    ]
    rows += [
        {"measure": train["step"], "median s": train["median s"], "rate": f"{train['GFLOP/s']:.2f} GFLOP/s"},
        {"measure": "fp32 matmul peak", "median s": None, "rate": f"{peak / 1e9:.2f} GFLOP/s"},
        *sharing,
        folding,
    ]
    return Section(
        title="Generation throughput and training MFU",
        command=f".venv/bin/python -m benchmarks.bench_generation{' --quick' if quick else ''}",
        rows=rows,
        targets=[Target("batched / naive generation tokens/s", gen[0]["tokens/s"] / gen[1]["tokens/s"], at_least=1.0)],
        notes=[
            f"model {model}, {n} MathChat prompts, {max_new} new tokens, T = 1; training on {len(prompts[:8])} "
            f"sequences with {max_new}-token responses, LoRA rank {policy.cfg.lora_rank}",
            f"MFU of a training step: {mfu:.1%} of the measured matmul peak",
        ],
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, a few prompts, one repeat")
    print(run(ap.parse_args().quick).markdown())
