"""Where a decode step of the hf engine goes, on the probe's 4B-shaped model: transformers' own greedy
generate, infra.generation.generate (our Sampler as the logits processor), greedy and sampled, with the
same batch and length (64 sequences, 200 prompt tokens, 32 new tokens); milliseconds per decode step, median of
2 after a warm-up. Writes decode_check.json to $OUT (or /tmp).

    python3 benchmarks/decode_check.py            # on a GPU machine
    python3 benchmarks/decode_check.py smoke      # a tiny model, on the CPU too
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch

from benchmarks.gpu_probe import SHAPES
from infra.generation import generate
from infra.models import ModelConfig, load_base, load_tokenizer

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3-4b"
h, layers, heads, mlp = SHAPES[shape]
dev = "cuda" if torch.cuda.is_available() else "cpu"
cfg = ModelConfig(
    name="tiny",
    tiny_hidden=h,
    tiny_layers=layers,
    tiny_heads=heads,
    tiny_intermediate=mlp,
    dtype="bfloat16" if dev == "cuda" else "float32",
)
tok = load_tokenizer(cfg)
with torch.device(dev):  # initialised where it runs: 4B random weights are slow to draw on the CPU
    model = load_base(cfg, tok)
B, N = 64, 32
prompts = [list(range(100, 300))] * B
ids = torch.tensor(prompts, device=dev)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)


def hf_plain():
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=N,
        min_new_tokens=N,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )


def ours(greedy):
    return lambda: generate(model, tok, prompts, N, greedy=greedy, batch_size=B, stop_ids=[-1 % len(tok)])


def forward_only():  # N single-token forwards with a KV cache, no generate loop
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        past, nxt = out.past_key_values, ids[:, -1:]
        for _ in range(N):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values


rows = {}
for name, fn in [
    ("model forward + KV cache, no generate", forward_only),
    ("transformers generate, greedy", hf_plain),
    ("infra.generation.generate, greedy", ours(True)),
    ("infra.generation.generate, sampled T=1", ours(False)),
]:
    times = []
    for k in range(3):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if k:
            times.append(time.perf_counter() - t0)
    rows[name] = round(statistics.median(times) / N * 1000, 2)
    print(name, rows[name], "ms per decode step", flush=True)
res = {
    "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
    "torch": torch.__version__,
    "batch": B,
    "new_tokens": N,
    "prompt_tokens": 200,
    "ms_per_decode_step": rows,
}
print(json.dumps(res, indent=1))
Path(os.environ.get("OUT", "/tmp"), "decode_check.json").write_text(json.dumps(res, indent=1))
