"""System-1 extraction over bin-packed tool output (MARS), the DAG stage `extract`.

Per System-2 turn, every tool call of every active episode hands its raw documents here. Each call's
documents are tokenized, cut where longer than a bin, and packed with First Fit Decreasing into bins of
`capacity` tokens (binpack.py); then System 1 reads every bin of every call in ONE batched generation and
writes what serves the call's purpose. The pipeline runs it through `act.stage("extract", ...)`, once per
turn (System 2's next turn needs the extractions), so it is its own Prefect task run.
"""

from __future__ import annotations

from infra.faults import crash_point
from pipelines.base import Extraction, ToolCall
from pipelines.dual_system.binpack import lower_bound, pack


def pack_call(tokenizer, documents: list[str], capacity: int) -> tuple[list[str], int, int]:
    """(bin texts, tokens in, lower bound): a bin's pieces keep document order, separated by a blank line."""
    ids = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in documents]
    sizes = [len(x) for x in ids]
    texts = ["\n\n".join(tokenizer.decode(ids[i][s:e]) for i, s, e in sorted(b)) for b in pack(sizes, capacity)]
    return texts, sum(sizes), lower_bound(sizes, capacity)


def extract(pipe, act, calls: list[ToolCall], capacity: int) -> list[Extraction]:
    """System 1 over the packed bins of `calls`: one Extraction per call, in order."""
    packed = [pack_call(act.tokenizer, c.documents, capacity) for c in calls]
    chats = [pipe.system1_chat(c.purpose, t) for c, (texts, _, _) in zip(calls, packed) for t in texts]
    gens = act("system1", chats) if chats else []
    crash_point("extract")
    out, i = [], 0
    for texts, n_in, lb in packed:
        out.append(Extraction(texts, gens[i : i + len(texts)], n_in, lb))
        i += len(texts)
    return out
