"""Peak memory and time of one batched `generate` (16 prompts x 128 sampled tokens, SmolLM2-135M).

    .venv/bin/python benchmarks/generate_memory.py

Measures the code on PYTHONPATH, so a before/after compares two checkouts:

    git worktree add /tmp/before <commit> && PYTHONPATH=/tmp/before .venv/bin/python benchmarks/generate_memory.py

The process's peak RSS (ru_maxrss) is read before and after the call; the difference is what the
generation added on top of the loaded model.
"""

import resource
import time

import torch

from infra.generation import encode_chat, generate
from infra.models import ModelConfig
from infra.policy import TeamPolicy

policy = TeamPolicy(ModelConfig(name="smollm2-135m-instruct"), ["a"], seed=0)
prompts = [
    encode_chat(policy.tokenizer, [{"role": "user", "content": f"Tell a long story about the number {i}."}])
    for i in range(16)
]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with policy.acting("a") as model:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    gens = generate(model, policy.tokenizer, prompts, 128, temperature=1.0, batch_size=16, stop_ids=[-1])
    seconds = time.perf_counter() - t0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(
    f"{sum(len(g.response_ids) for g in gens)} tokens in {seconds:.1f} s; peak RSS {before // 1024} MiB with the "
    f"model, {after // 1024} MiB after generating (+{(after - before) // 1024} MiB)"
)
