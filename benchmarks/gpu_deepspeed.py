"""GPU check of the `deepspeed` trainer (infra/engines/deepspeed.py) against the `torch` trainer on one GPU.

A random Llama (the `tiny` model config, enlarged) with two agents; the same training items and
hyper-parameters go through `train_agent` (torch) and `DeepSpeedTrainer` at ZeRO stages 0 and 3, each
from the same starting weights. Prints and writes (to $OUT or .) the largest weight difference from the
torch update, seconds per update (median of the timed repeats, after one warm-up), trained tokens/s,
and peak GPU memory; checks the other agent's weights were not touched.

    python3 benchmarks/gpu_deepspeed.py --weights lora     # on a GPU machine with deepspeed installed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def items(n: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list:
    import torch

    from infra.trainer import TrainItem

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(10, vocab, (prompt + i % 7,), generator=g).tolist()
        r = torch.randint(10, vocab, (response - i % 5,), generator=g).tolist()
        out.append(TrainItem(p, r, [-7.0] * len(r), torch.randn(len(r), generator=g).tolist(), [1] * len(r)))
    return out


def main() -> None:
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.deepspeed import DeepSpeedTrainer
    from infra.engines.torch import train_agent
    from infra.engines.zero import DeepSpeedConfig
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy
    from infra.trainer import TrainSpec
    from tasks.losses import ppo_clip_loss

    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="lora", choices=["lora", "full"])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    cfg = ModelConfig(
        name="tiny",
        weights=args.weights,
        tiny_hidden=args.hidden,
        tiny_layers=args.layers,
        tiny_heads=args.hidden // 64,
        tiny_intermediate=int(args.hidden * 2.75),
        lora_rank=16,
        lora_alpha=32,
    )
    policy = TeamPolicy(cfg, ["a", "b"], seed=0, device="cuda")
    data = items(args.items, 192, 64, len(policy.tokenizer))
    tokens = sum(len(it.response_ids) for it in data)
    hyper = dict(lr=1e-4, weight_decay=0.01, epochs=1, minibatch_size=8, max_grad_norm=1.0, seed=0, micro_batch_size=4)
    loss = partial(ppo_clip_loss, clip_eps=0.2)
    w0 = [p.detach().clone() for p in policy.parameters("a")]
    other = [p.detach().clone() for p in policy.parameters("b")]

    def reset():  # ZeRO-3 leaves large weights partitioned: write them whole
        with policy.materialized("a", modify=True), torch.no_grad():
            for p, w in zip(policy.parameters("a"), w0):
                p.copy_(w)

    def run(name, step):
        times, after = [], None
        for k in range(args.repeats + 1):  # the first is a warm-up
            reset()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            res, _ = step()
            torch.cuda.synchronize()
            if k:
                times.append(time.perf_counter() - t0)
            with policy.materialized("a"):
                after = [p.detach().clone() for p in policy.parameters("a")]
        sec = statistics.median(times)
        return {
            "trainer": name,
            "loss": res.loss,
            "skipped": res.skipped,
            "seconds_per_update": round(sec, 3),
            "trained_tokens_per_s": round(tokens / sec, 1),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }, after

    rows = []
    row, w_torch = run("torch", lambda: train_agent(policy, "a", data, loss, TrainSpec(**hyper)))
    rows.append(row | {"max_abs_diff_vs_torch": 0.0})
    for stage in (0, 3):
        trainer = DeepSpeedTrainer(
            EnginesConfig(device="cuda", trainer="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=stage))
        )
        row, w = run(f"deepspeed-zero{stage}", lambda: trainer.train(policy, "a", data, loss, TrainSpec(**hyper)))  # noqa: B023 (run at once)
        diff = max(float((a - b).abs().max()) for a, b in zip(w_torch, w))
        rows.append(row | {"max_abs_diff_vs_torch": diff})
    with policy.materialized("b"):
        untouched = all(torch.equal(a, b) for a, b in zip(other, policy.parameters("b")))
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "weights": args.weights,
        "model": f"random Llama hidden {args.hidden}, {args.layers} layers, vocab {len(policy.tokenizer)}",
        "items": args.items,
        "trained_tokens": tokens,
        "other_agent_untouched": untouched,
        "rows": rows,
    }
    print(json.dumps(out, indent=1))
    Path(os.environ.get("OUT", "."), f"gpu_deepspeed_{args.weights}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
