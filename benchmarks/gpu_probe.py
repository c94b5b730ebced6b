"""GPU probe of the default engines at real model size: the `hf` generation engine and the `torch` trainer
on a three-agent LoRA team whose base has Qwen3-4B's width, depth and MLP (random weights, bf16).

One MathChat-shaped turn order (solver, then executor, then verifier, each prompt carrying the turns
before it) for `questions x episodes` prompts at `mathchat-gpu`'s token budgets, then one update of each
agent on its own samples with the PPO-clip loss. Random weights almost never sample the end-of-sequence
token, so nearly every response runs to its budget and the throughput is that of full-length replies;
the tokens actually generated are what is counted. Prints and writes (to $OUT or .) generation tokens/s,
update tokens/s, seconds per stage, the update's model FLOP utilisation against this GPU's bf16 matmul
peak measured in the same run (an estimate that counts every sample's prompt as processed; the trainer runs
a prompt that a micro-batch's samples share once, so it overstates), and peak GPU memory; with `--full`,
the same update for one agent with full weights.

What it leaves out, and why: the rubric coach and the advantage estimators live behind Prefect tasks,
which the GPU image lacks; the advantages here are standard-normal draws (the update's cost does not
depend on their values). The base is a Llama with Qwen3-4B's dimensions (hidden 2560, 36 layers, MLP
9728, head size 128) but multi-head attention (20 heads, where Qwen3 has 32 query and 8 key/value heads)
and SmolLM2's 49k-token vocabulary (Qwen3 has 152k): about 3.6B parameters against Qwen3-4B's 4.0B.

    python3 benchmarks/gpu_probe.py [--questions 8 --episodes 8] [--full]   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUDGETS = {"solver": 128, "executor": 256, "verifier": 32}  # flows/presets/mathchat-gpu.yaml max_new_tokens
QUESTION = (
    "A baker sells {a} loaves on Monday and {b} more on Tuesday than on Monday. Each loaf costs {c} dollars. "
    "How many dollars does the baker take over both days?"
)


def matmul_peak(n: int = 8192, repeats: int = 10) -> float:
    """bf16 matmul TFLOP/s on this GPU: 2 n^3 flops a product, mean of `repeats` after three warm-ups."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e12


def mfu(flops_per_token: float, tokens_per_s: float, peak_tflops: float) -> float:
    """Model FLOP utilisation: flops_per_token * tokens/s / peak."""
    return round(flops_per_token * tokens_per_s / (peak_tflops * 1e12), 3)


def timed(fn):
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def peak_gib() -> float:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0.0


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


# Qwen3-4B's hidden size, depth and MLP width (head size 128); SMOKE: a few-second CPU check of the script
SHAPES = {"qwen3-4b": (2560, 36, 20, 9728), "smoke": (128, 2, 2, 256)}


def team(weights: str, agents: list[str], shape: str, device: str):
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    cfg = ModelConfig(
        name="tiny",
        weights=weights,
        tiny_hidden=SHAPES[shape][0],
        tiny_layers=SHAPES[shape][1],
        tiny_heads=SHAPES[shape][2],
        tiny_intermediate=SHAPES[shape][3],
        dtype="bfloat16" if device == "cuda" else "float32",
        lora_rank=16,
        lora_alpha=32,
    )
    return cfg, TeamPolicy(cfg, agents, seed=0, device=device)


def update(policy, agent: str, gens: list, micro_batch: int) -> dict:
    """One update of `agent` on its samples (standard-normal advantages), timed."""
    import torch

    from infra.engines.torch import train_agent
    from infra.trainer import TrainItem, TrainSpec
    from tasks.losses import ppo_clip_loss

    g = torch.Generator().manual_seed(0)
    data = [
        TrainItem(
            x.prompt_ids,
            x.response_ids,
            x.logprobs,
            torch.randn(len(x.response_ids), generator=g).tolist(),
            [1] * len(x.response_ids),
        )
        for x in gens
        if x.response_ids
    ]
    spec = TrainSpec(
        lr=1e-5, weight_decay=0.0, epochs=1, minibatch_size=64, max_grad_norm=1.0, seed=0, micro_batch_size=micro_batch
    )
    reset_peak()
    (res, _), seconds = timed(lambda: train_agent(policy, agent, data, partial(ppo_clip_loss, clip_eps=0.2), spec))
    trained = sum(len(it.response_ids) for it in data)
    processed = sum(len(it.prompt_ids) + len(it.response_ids) for it in data)
    return {
        "agent": agent,
        "samples": len(data),
        "trained_tokens": trained,
        "processed_tokens": processed,
        "seconds": round(seconds, 2),
        "trained_tokens_per_s": round(trained / seconds, 1),
        "processed_tokens_per_s": round(processed / seconds, 1),
        "loss": res.loss,
        "skipped": res.skipped,
        "peak_gpu_gib": peak_gib(),
    }


def main() -> None:
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.hf import HFGeneration
    from infra.engines.types import GenerationRequest
    from infra.generation import encode_chat

    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64, help="engines.batch_size: prompts per generate call")
    ap.add_argument("--micro-batch", type=int, default=8, help="algorithm.micro_batch_size (mathchat-gpu: 8)")
    ap.add_argument("--full", action="store_true", help="also update one agent with full weights")
    ap.add_argument("--shape", default="qwen3-4b", choices=list(SHAPES), help="smoke: a tiny model, on the CPU too")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert device == "cuda" or args.shape == "smoke", "the real-size probe needs a GPU"
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    out["matmul_peak_tflops"] = round(matmul_peak(), 1) if device == "cuda" else None
    if device == "cuda":
        torch.cuda.empty_cache()

    agents = list(BUDGETS)
    (cfg, policy), out["team_build_s"] = timed(lambda: team("lora", agents, args.shape, device))
    n_params = sum(p.numel() for name, p in policy.model.named_parameters() if "lora_" not in name)
    out["base_params"] = n_params
    h, layers, heads, mlp = SHAPES[args.shape]
    out["model"] = (
        f"random Llama, hidden {h}, {layers} layers, {heads} heads, MLP {mlp}, vocab {len(policy.tokenizer)}, LoRA r16"
    )
    out["questions_x_episodes"] = [args.questions, args.episodes]
    engine = HFGeneration(policy, cfg, EnginesConfig(device=device, batch_size=args.batch_size), agents, seed=0)
    tok = policy.tokenizer
    prompts = []
    for q in range(args.questions):
        chat = [{"role": "user", "content": QUESTION.format(a=12 + q, b=3 + q, c=2 + q % 5)}]
        prompts += [encode_chat(tok, chat)] * args.episodes
    gens, stages = {}, []
    for k, agent in enumerate(agents):
        req = GenerationRequest(agent=agent, prompts=prompts, max_new_tokens=BUDGETS[agent], seed=k)
        reset_peak()
        gens[agent], sec = timed(lambda: engine.generate(req))  # noqa: B023 (called at once)
        toks = sum(len(g.response_ids) for g in gens[agent])
        stages.append(
            {
                "stage": f"generate {agent}",
                "prompts": len(prompts),
                "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
                "new_tokens": toks,
                "truncated": sum(g.truncated for g in gens[agent]),
                "seconds": round(sec, 2),
                "tokens_per_s": round(toks / sec, 1),
                "peak_gpu_gib": peak_gib(),
            }
        )
        print(json.dumps(stages[-1]), flush=True)
        prompts = [g.prompt_ids + g.response_ids for g in gens[agent]]  # the next agent reads the turns before
    out["generation"] = stages
    ups = []
    for agent in agents:
        ups.append(update(policy, agent, gens[agent], args.micro_batch))
        print(json.dumps(ups[-1]), flush=True)
    if out["matmul_peak_tflops"]:  # LoRA: forward 2N + input-gradient backward 2N flops a token (frozen base)
        for u in ups:
            u["mfu_estimate"] = mfu(4 * n_params, u["processed_tokens_per_s"], out["matmul_peak_tflops"])
    out["update_lora"] = ups
    if args.full:
        del engine, policy
        if device == "cuda":
            torch.cuda.empty_cache()
        try:
            _, full = team("full", ["solver"], args.shape, device)
            u = update(full, "solver", gens["solver"], args.micro_batch)
            if out["matmul_peak_tflops"]:  # full weights: forward 2N + backward 4N flops a token
                u["mfu_estimate"] = mfu(6 * n_params, u["processed_tokens_per_s"], out["matmul_peak_tflops"])
            out["update_full"] = u
        except torch.OutOfMemoryError as e:
            out["update_full"] = f"out of memory: {e}"
        print(json.dumps(out.get("update_full")), flush=True)
    print(json.dumps(out, indent=1))
    Path(os.environ.get("OUT", "."), "gpu_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
