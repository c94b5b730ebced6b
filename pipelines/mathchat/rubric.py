"""The deterministic MathChat rubrics: score every action 0..10 from tool feedback (and, in
`rubric_scores`, the ground truth), blaming the agent that caused a failure rather than the one that
reported it. An agent whose failure was upstream's gets no score (None: `skipped`, no gradient): a
"neutral" 5 is not neutral, since REINFORCE++ whitens an agent's scores over its batch, so a 5 among
higher scores becomes a negative advantage for a failure that was not its own."""

from __future__ import annotations

import re

from pipelines.base import Episode, extract_code

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


def program_result(ep: Episode) -> tuple[str, int | None]:
    """The executor's tool output and the number it printed (None when it failed or printed none)."""
    out = ep.actions[1]["tool_output"] or ""
    failed = out.startswith(("ERROR", "TIMEOUT", "NO CODE"))
    return out, None if failed else last_int(out)


def executor_failure(out: str, printed: int | None) -> tuple[float, str] | None:
    """The executor's score when its program gave no number, else None."""
    if out.startswith("NO CODE"):
        return 0.0, "no Python code block"
    if out.startswith("TIMEOUT"):
        return 1.0, "program timed out"
    if out.startswith("ERROR"):
        return 2.0, f"program failed: {out}"
    if printed is None:
        return 3.0, "program printed no number"
    return None


def quantities_used(ep: Episode) -> float:
    """The share of the question's numbers that the solver's plan mentions."""
    quantities = set(INT_RE.findall(ep.problem.question))
    return sum(q in ep.actions[0]["response_text"] for q in quantities) / max(1, len(quantities))


def rubric_scores(ep: Episode) -> list[tuple[float | None, str]]:
    """Solver, executor, verifier judged against the ground truth `ep.problem.answer`."""
    truth = ep.problem.answer
    out, printed = program_result(ep)
    code_right = printed is not None and str(printed) == truth

    # Executor: judged on its own program.
    if failure := executor_failure(out, printed):
        ex = failure
    elif code_right:
        ex = (10.0, "program printed the correct answer")
    else:
        ex = (4.0, f"program printed {printed}, expected {truth}")

    # Solver: credited when its plan led to correct code or names the answer; else by whether it used the data.
    used = quantities_used(ep)
    if code_right:
        so = (10.0, "plan led to a correct program")
    elif truth in INT_RE.findall(ep.actions[0]["response_text"]):
        so = (8.0, "plan reached the correct answer; the executor failed to implement it")
    else:
        so = (round(2.0 + 4.0 * used, 2), f"plan did not lead to the answer; used {used:.0%} of the quantities")

    # Verifier: blamed only for what it states. With no program result, or a wrong one it reported
    # faithfully, upstream is at fault: not scored (unless it states the truth), so failing upstream
    # never teaches it silence.
    stated = ep.final_answer
    ve: tuple[float | None, str]
    if stated == truth:
        ve = (10.0, "stated the correct answer")
    elif code_right:
        ve = (0.0, f"program output was correct ({printed}) but the verifier stated {stated or 'nothing'}")
    elif printed is None:
        ve = (None, "not scored: the program gave no result; upstream is at fault")
    elif stated == str(printed):
        ve = (None, "not scored: faithfully reported the (wrong) program output; upstream is at fault")
    elif not stated:
        ve = (3.0, "stated no answer although the program printed one")
    else:
        ve = (2.0, f"stated {stated}, which neither the program nor the truth supports")
    return [so, ex, ve]


def blind_rubric_scores(ep: Episode) -> list[tuple[float | None, str]]:
    """Solver, executor, verifier judged from the episode alone, never reading `ep.problem.answer`
    (coach.ground_truth=false): whether a printed number is right is unknown, so what is scored is
    whether each agent did its own step with the evidence it had."""
    out, printed = program_result(ep)

    # Executor: a program that runs and prints a number did its job, as far as the episode shows.
    ex = executor_failure(out, printed) or (8.0, f"program ran and printed {printed}")

    # Solver: a plan (not code) that uses the question's quantities: 2 + 8 x the share it mentions.
    plan = ep.actions[0]["response_text"]
    used = quantities_used(ep)
    if extract_code(plan) is not None:
        so = (1.0, "wrote code instead of a plan")
    else:
        so = (round(2.0 + 8.0 * used, 2), f"a plan using {used:.0%} of the question's quantities")

    # Verifier: faithful to the program's output, in the ANSWER format. With no program result it has
    # nothing to report: upstream is at fault, not scored.
    stated, explicit = ep.final_answer, ANSWER_RE.search(ep.actions[2]["response_text"] or "")
    ve: tuple[float | None, str]
    if printed is None:
        ve = (None, "not scored: the program gave no result to report; upstream is at fault")
    elif not stated:
        ve = (3.0, "stated no answer although the program printed one")
    elif stated != str(printed):
        ve = (2.0, f"stated {stated}, which the program did not print (it printed {printed})")
    elif explicit:
        ve = (10.0, f"reported the program's output as ANSWER: {printed}")
    else:
        ve = (6.0, f"reported the program's output {printed}, but not as ANSWER: <int>")
    return [so, ex, ve]
