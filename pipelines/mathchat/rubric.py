"""The deterministic MathChat rubric: scores every action 0..10 from tool feedback and ground
truth, blaming the agent that caused a failure rather than the one that reported it."""
from __future__ import annotations

import re

from pipelines.base import Episode

INT_RE = re.compile(r"-?\d[\d,]*")
ANSWER_RE = re.compile(r"(?:ANSWER\s*[:=]\s*|\\boxed\{)\s*(-?\d[\d,]*)", re.I)


def last_int(text: str | None) -> int | None:
    """The last integer in `text` (thousands separators allowed), or None."""
    found = INT_RE.findall(text or "")
    for tok in reversed(found):
        try:
            return int(tok.replace(",", ""))
        except ValueError:
            continue
    return None


def extract_int(text: str) -> int | None:
    """The stated final answer: `ANSWER: N` / `\\boxed{N}` if present, else the last integer."""
    m = ANSWER_RE.search(text or "")
    return int(m.group(1).replace(",", "")) if m else last_int(text)


def rubric_scores(ep: Episode) -> list[tuple[float, str]]:
    solver, executor, verifier = ep.actions
    truth = ep.problem.answer
    out = executor["tool_output"] or ""
    failed = out.startswith(("ERROR", "TIMEOUT", "NO CODE"))
    printed = None if failed else last_int(out)
    code_right = printed is not None and str(printed) == truth

    # Executor: judged on its own program.
    if out.startswith("NO CODE"):
        ex = (0.0, "no Python code block")
    elif out.startswith("TIMEOUT"):
        ex = (1.0, "program timed out")
    elif failed:
        ex = (2.0, f"program failed: {out}")
    elif printed is None:
        ex = (3.0, "program printed no number")
    elif code_right:
        ex = (10.0, "program printed the correct answer")
    else:
        ex = (4.0, f"program printed {printed}, expected {truth}")

    # Solver: credited when its plan led to correct code or names the answer; else by whether it used the data.
    quantities = set(INT_RE.findall(ep.problem.question))
    used = sum(q in solver["response_text"] for q in quantities) / max(1, len(quantities))
    if code_right:
        so = (10.0, "plan led to a correct program")
    elif truth in INT_RE.findall(solver["response_text"]):
        so = (8.0, "plan reached the correct answer; the executor failed to implement it")
    else:
        so = (round(2.0 + 4.0 * used, 2), f"plan did not lead to the answer; used {used:.0%} of the quantities")

    # Verifier: blamed only for what it states. With no program result it has no evidence: a neutral
    # score whatever it says (unless it states the truth), so failing upstream never teaches it silence.
    stated = ep.final_answer
    if stated == truth:
        ve = (10.0, "stated the correct answer")
    elif code_right:
        ve = (0.0, f"program output was correct ({printed}) but the verifier stated {stated or 'nothing'}")
    elif printed is None:
        ve = (5.0, "the program gave no result; upstream is at fault")
    elif stated == str(printed):
        ve = (5.0, "faithfully reported the (wrong) program output; upstream is at fault")
    elif not stated:
        ve = (3.0, "stated no answer although the program printed one")
    else:
        ve = (2.0, f"stated {stated}, which neither the program nor the truth supports")
    return [so, ex, ve]
