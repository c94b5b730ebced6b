"""The local `llm` coach's server: `transformers serve` with and without continuous batching.

    .venv/bin/python -m benchmarks.bench_coach_serving [--quick]

The coach sends `coach.concurrency` requests at once. Without continuous batching `transformers serve`
answers them one after another; with it (`--continuous-batching`, infra/local_llm.py's default) it
decodes them in one batch. Both servers get the same real coach chats: the first actions of the stored
sample run under benchmarks/coach_agreement/sample/ (tasks/coach.py `coach_messages`, with the answer),
all sent at once, greedy, at most `coach.max_tokens` reply tokens, three rounds a server. Reported: the
median wall seconds of a round, reply tokens per second, and how many replies were the same text both
ways (batched float arithmetic can change a greedy reply).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import Section

SAMPLE = Path(__file__).resolve().parent / "coach_agreement" / "sample" / "abl-teamtr-s1"


def coach_chats(n: int) -> tuple[list[list[dict]], int]:
    """The chats the `llm` coach would send for the sample run's first `n` actions, and its reply limit."""
    from tasks.coach import coach_messages
    from tasks.coach_evaluate import coach_requests, load_partition_episodes
    from tasks.context import RunContext

    ctx = RunContext(SAMPLE)
    cfg = ctx.config.coach.model_copy(update={"backend": "llm", "ground_truth": True})
    episodes = load_partition_episodes(str(SAMPLE), 1, "rollout")
    chats = [coach_messages(cfg, r) for r in coach_requests(ctx.pipeline, episodes, True)][:n]
    if len(chats) < n:
        raise RuntimeError(f"{SAMPLE}: {len(chats)} coach requests in iteration 1's rollouts, fewer than {n}")
    return chats, cfg.max_tokens


def serve_batch(
    chats: list[list[dict]], max_tokens: int, continuous_batching: bool, repeats: int
) -> tuple[list[float], list[str], int]:
    """(wall seconds of each of `repeats` rounds, the last round's replies, its reply tokens) of all `chats`
    sent at once to a fresh local server."""
    from openai import OpenAI

    from infra.local_llm import transformers_serve
    from infra.models import smollm2_dir

    model = str(smollm2_dir())
    with transformers_serve(model, continuous_batching=continuous_batching) as url:
        client = OpenAI(base_url=url, api_key="none", timeout=1800, max_retries=0)

        def ask(messages: list[dict]):
            return client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0.0
            )

        ask(chats[0])  # the first request loads the model: not timed
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(chats)) as pool:
                replies = list(pool.map(ask, chats))
            walls.append(time.perf_counter() - t0)
    texts = [r.choices[0].message.content or "" for r in replies]
    return walls, texts, sum(r.usage.completion_tokens for r in replies if r.usage)


def run(quick: bool = False) -> Section:
    chats, max_tokens = coach_chats(4 if quick else 8)
    if quick:
        max_tokens = 16
    repeats = 1 if quick else 3
    one_by_one = serve_batch(chats, max_tokens, continuous_batching=False, repeats=repeats)
    batched = serve_batch(chats, max_tokens, continuous_batching=True, repeats=repeats)
    ways = (("one at a time", one_by_one), ("continuous batching", batched))
    wall = {name: statistics.median(walls) for name, (walls, _, _) in ways}
    rows = [
        {
            "server": name,
            "requests at once": len(chats),
            "median wall s": wall[name],
            "reply tokens": toks,
            "tokens/s": toks / wall[name],
        }
        for name, (_, _, toks) in ways
    ]
    same = sum(a == b for a, b in zip(one_by_one[1], batched[1]))
    return Section(
        title="The local coach server: continuous batching",
        command=f".venv/bin/python -m benchmarks.bench_coach_serving{' --quick' if quick else ''}",
        rows=rows,
        notes=[
            "continuous batching / one at a time, median wall: "
            f"{wall['continuous batching'] / wall['one at a time']:.2f}",
            "wall s of each round (one server a way, after an untimed request that loads the model): "
            + "; ".join(f"{name} {', '.join(f'{w:.1f}' for w in walls)}" for name, (walls, _, _) in ways),
            f"replies identical both ways: {same} of {len(chats)} (greedy; batched arithmetic can differ)",
            f"SmolLM2-135M-Instruct, the coach's chats for the first {len(chats)} actions of {SAMPLE.name}'s "
            f"iteration-1 rollouts, at most {max_tokens} reply tokens each",
        ],
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 requests of at most 16 reply tokens")
    print(run(ap.parse_args().quick).markdown())
