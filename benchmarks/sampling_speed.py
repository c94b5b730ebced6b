"""Seconds and peak memory of the `hf` engine's sampling: 2 chat prompts x 4 samples x 32 tokens (no
stop token) on SmolLM2-135M with a LoRA adapter, one thread, median of 5 calls after a warm-up.

    .venv/bin/python benchmarks/sampling_speed.py acting     # the adapter beside every layer
    .venv/bin/python benchmarks/sampling_speed.py sampling   # folded into the base (what the engine does)

Run it with PYTHONPATH=<checkout> to time another commit's `generate` (`acting` exists in every one).
"""

import statistics
import sys
import threading
import time

import psutil
import torch

from infra.generation import encode_chat, generate
from infra.models import ModelConfig
from infra.policy import TeamPolicy

torch.set_num_threads(1)
policy = TeamPolicy(ModelConfig(name="smollm2-135m-instruct"), ["solver"], seed=0)
chats = [
    [{"role": "user", "content": q}]
    for q in ("Write a short story about a cat who learns to swim.", "Explain how a bicycle works to a child.")
]
prompts = [encode_chat(policy.tokenizer, c) for c in chats for _ in range(4)]
weights = getattr(policy, sys.argv[1])
me, peak, done = psutil.Process(), [0], threading.Event()


def watch():  # the resident set's peak while generating, polled every 5 ms
    while not done.wait(0.005):
        peak[0] = max(peak[0], me.memory_info().rss)


loaded = me.memory_info().rss
threading.Thread(target=watch, daemon=True).start()
seconds = []
for i in range(6):
    torch.manual_seed(i)
    t0 = time.perf_counter()
    with weights("solver") as model:
        generate(model, policy.tokenizer, prompts, 32, temperature=1.0, stop_ids=[-1])
    seconds.append(time.perf_counter() - t0)
done.set()
grown = (peak[0] - loaded) / 2**20
print(
    f"{sys.argv[1]}: median {statistics.median(seconds[1:]):.2f} s of "
    f"{[round(s, 2) for s in seconds[1:]]}; peak RSS +{grown:.0f} MiB over the loaded model"
)
