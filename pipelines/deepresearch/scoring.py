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


def contains(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` as whole words, any case."""
    return bool(phrase.strip()) and re.search(rf"(?<!\w){re.escape(phrase.strip())}(?!\w)", text, re.I) is not None


def rubric_scores(ep: Episode, support_titles: list[str]) -> list[tuple[float, str]]:
    """A score 0..10 per action. System 2's answer: 10 x F1. Its tool call: 10 when a support document
    came back, 2 when none did, 0 for a turn that was neither a tool call nor an answer. System 1 (what
    it must pass on is the answer and the later hops' entities: the support titles after the first, which
    the question names, that its purpose does not name already): 10 when its bin held one of them and the
    extraction names one; 0 when the bin held one and the extraction names none; 5 for a bin without any
    (nothing to find)."""
    titles = [normalize(t) for t in support_titles]
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
            purpose = a["tool_input"] or ""
            needed = [ep.problem.answer] + [t for t in support_titles[1:] if not contains(purpose, t)]
            if not any(contains(a["tool_output"] or "", n) for n in needed):
                out.append((5.0, "bin without support text"))
            elif any(contains(a["response_text"] or "", n) for n in needed):
                out.append((10.0, "kept the support facts"))
            else:
                out.append((0.0, "dropped the support facts in its bin"))
    return out
