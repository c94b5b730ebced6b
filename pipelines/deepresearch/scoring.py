"""Deep-research outcome scorers (exact match, token F1) and the deterministic rubric coach."""

from __future__ import annotations

import re
import string
from collections import Counter

from pipelines.base import Episode

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (SQuAD-style)."""
    text = "".join(c for c in (text or "").lower() if c not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(pred: str, gold: str) -> float:
    """1 if the normalized strings are equal, else 0."""
    return float(normalize(pred) == normalize(gold) and normalize(gold) != "")


def f1(pred: str, gold: str) -> float:
    """Token F1 = 2 P R / (P + R), P = overlap / |pred tokens|, R = overlap / |gold tokens|."""
    p, g = normalize(pred).split(), normalize(gold).split()
    overlap = sum((Counter(p) & Counter(g)).values())
    if not p or not g or overlap == 0:
        return 0.0
    prec, rec = overlap / len(p), overlap / len(g)
    return 2 * prec * rec / (prec + rec)


def rubric_scores(ep: Episode, support_titles: list[str]) -> list[tuple[float, str]]:
    """A score 0..10 per action. System 2's answer: 10 x F1. Its tool call: 10 when a support document
    came back, 2 when none did, 0 for a turn that was neither a tool call nor an answer. System 1: 10
    when its bin held support text and the extraction names the answer or a support title; 0 when it
    held support text and dropped it; 5 for a bin with nothing relevant (nothing to find)."""
    titles = [normalize(t) for t in support_titles]
    answer = normalize(ep.problem.answer)
    out = []
    for a in ep.actions:
        if a["agent"] == "system2":
            if a["tool_name"] == "answer":
                s = 10.0 * f1(ep.final_answer, ep.problem.answer)
                out.append((s, f"final answer F1 {s / 10:.2f}"))
            elif a["tool_name"] in ("search", "python"):
                hit = any(t in normalize(a["tool_output"] or "") for t in titles)
                out.append((10.0, "retrieved a support document") if hit else (2.0, "no support document retrieved"))
            else:
                out.append((0.0, "neither a tool call nor an answer"))
        else:
            held = normalize(a["tool_output"] or "")
            said = normalize(a["response_text"])
            relevant = any(t in held for t in titles) or answer in held
            if not relevant:
                out.append((5.0, "bin without support text"))
            elif answer in said or any(t in said for t in titles):
                out.append((10.0, "kept the support facts"))
            else:
                out.append((0.0, "dropped the support facts in its bin"))
    return out
