"""Bin packing of System-1 input (MARS): bins against the lower bound, and extraction throughput.

    .venv/bin/python -m benchmarks.bench_binpack [--quick]

The tool calls are real searches of the deepresearch pipeline's generated corpus (documents of 50 to
2000 tokens): each training question, searched with top_k documents. Per call, pipelines/dual_system/extract.py cuts
documents longer than a bin and packs the pieces with First Fit Decreasing (pipelines/dual_system/binpack.py).

1. Packing quality: System-1 calls (bins) summed over all calls, against the sum of the per-call lower
   bounds ceil(sum of lengths / capacity), for several top_k and bin capacities.
2. Extraction throughput: documents extracted per second when System 1 reads the packed bins (the
   `extract` stage's prompts) against one call per document (each piece of a cut document its own
   call), both as one batched greedy generation with the same budget per call.
"""

from __future__ import annotations

import argparse

from benchmarks.common import Section, Target, median_seconds


def _pipeline():
    from pipelines.deepresearch import DeepResearch, DeepResearchConfig

    return DeepResearch(DeepResearchConfig(), seed=0)


def calls(pipe, n: int, top_k: int) -> list[tuple[str, list[str]]]:
    """(purpose, documents) of `n` searches: the training questions, `top_k` hits each."""
    out = []
    for p in pipe.problems("train")[:n]:
        docs = [f"# {d.title}\n{d.text}" for d in pipe.index.search(p.question, top_k)]
        out.append((p.question, docs))
    return out


def packing(tokenizer, pipe, n: int) -> tuple[list[dict], float]:
    from pipelines.dual_system.binpack import lower_bound, pack

    rows, worst = [], 0.0
    for top_k in (3, 8):
        sizes = [
            [len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
            for _, docs in calls(pipe, n, top_k)
        ]
        for cap in (256, 384, 1024):
            bins = sum(len(pack(s, cap)) for s in sizes)
            lb = sum(lower_bound(s, cap) for s in sizes)
            per_call = max(len(pack(s, cap)) / lower_bound(s, cap) for s in sizes)
            worst = max(worst, bins / lb)
            rows.append(
                {
                    "top_k": top_k,
                    "capacity": cap,
                    "calls": len(sizes),
                    "documents": sum(map(len, sizes)),
                    "bins (System-1 calls)": bins,
                    "lower bound": lb,
                    "bins / bound": bins / lb,
                    "worst call": per_call,
                }
            )
    return rows, worst


def throughput(policy, pipe, n: int, top_k: int, capacity: int, repeats: int) -> list[dict]:
    from infra.generation import encode_chat, generate
    from pipelines.dual_system.binpack import split_oversized
    from pipelines.dual_system.extract import pack_call

    tok, budget = policy.tokenizer, pipe.cfg.max_new_tokens["system1"]
    work = calls(pipe, n, top_k)
    packed, single = [], []
    for purpose, docs in work:
        packed += [pipe.system1_chat(purpose, t) for t in pack_call(tok, docs, capacity)[0]]
        ids = [tok(d, add_special_tokens=False)["input_ids"] for d in docs]
        single += [
            pipe.system1_chat(purpose, tok.decode(ids[i][s:e]))
            for i, s, e in split_oversized([len(x) for x in ids], capacity)
        ]
    n_docs = sum(len(d) for _, d in work)
    rows = []
    with policy.sampling("system1") as m:
        for name, chats in (("packed bins (extract stage)", packed), ("one document per call", single)):
            prompts = [encode_chat(tok, c) for c in chats]
            s = median_seconds(lambda: generate(m, tok, prompts, budget, greedy=True, batch_size=16), repeats, warmup=0)  # noqa: B023 (timed here, in its iteration)
            rows.append(
                {
                    "System-1 input": name,
                    "top_k": top_k,
                    "capacity": capacity,
                    "calls": len(prompts),
                    "prompt tokens": sum(map(len, prompts)),
                    "median s": s,
                    "documents/s": n_docs / s,
                }
            )
    return rows


def run(quick: bool = False) -> Section:
    from infra.models import ModelConfig, load_tokenizer
    from infra.policy import TeamPolicy

    pipe = _pipeline()
    pack_rows, ratio = packing(load_tokenizer(ModelConfig(name="tiny")), pipe, 40 if quick else 200)
    model, searches = ("tiny", 4) if quick else ("smollm2-135m-instruct", 8)
    policy = TeamPolicy(ModelConfig(name=model), ["system1"], seed=0)
    thr, speedups = [], []
    for top_k, cap in ((3, pipe.cfg.bin_tokens), (8, 1024)):  # the preset's searches; many documents, large bins
        rows = throughput(policy, pipe, searches, top_k, cap, repeats=1 if quick else 2)
        thr += rows
        speedups.append(rows[0]["documents/s"] / rows[1]["documents/s"])
    return Section(
        title="Bin packing of System-1 input",
        command=f".venv/bin/python -m benchmarks.bench_binpack{' --quick' if quick else ''}",
        rows=pack_rows + thr,
        targets=[
            Target("System-1 calls / lower bound (worst setting)", ratio, at_most=1.05),
            Target(
                f"extraction documents/s, packed / one per call (top_k 3, capacity {pipe.cfg.bin_tokens})",
                speedups[0],
                at_least=2.0,
            ),
            Target("extraction documents/s, packed / one per call (top_k 8, capacity 1024)", speedups[1], at_least=2.0),
        ],
        notes=[
            f"throughput: {model}, {searches} searches per setting, greedy, at most "
            f"{pipe.cfg.max_new_tokens['system1']} new tokens per call, batches of 16; a document longer than a "
            "bin is cut on both sides, so packing saves calls only where documents are shorter than bins"
        ],
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer searches, the tiny model")
    print(run(ap.parse_args().quick).markdown())
