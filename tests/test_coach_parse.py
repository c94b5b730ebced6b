"""The coach's answer parser and prompt (tasks/coach.py)."""

import pytest

from tasks.coach import CoachRequest, build_prompt, parse_score


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Solid plan.\nPROCESS_SCORE: 7", 7.0),
        ("process_score = 3", 3.0),  # case-insensitive, `=` allowed
        ("First PROCESS_SCORE: 2, on reflection\nPROCESS_SCORE: 9", 9.0),  # the last occurrence wins
        ("PROCESS_SCORE: 6.5", 6.5),
        ("PROCESS_SCORE: **7**", 7.0),  # markdown bold
        ("PROCESS_SCORE: 0", 0.0),
        ("PROCESS_SCORE: 10", 10.0),
        ("I'd give it a 7.", None),  # missing
        ("", None),
        (None, None),
        ("PROCESS_SCORE: 11", None),  # out of range
        ("PROCESS_SCORE: -1", None),
        ("PROCESS_SCORE: 8\nPROCESS_SCORE: 12", None),  # the last one counts, even if invalid
    ],
)
def test_parse_score(text, expected):
    assert parse_score(text) == expected


def _req(context="the solver said: add 2 and 3"):
    return CoachRequest(
        question="What is 2 + 3?",
        role="Verifier: states the final answer",
        context=context,
        action="ANSWER: 5",
        feedback="Program output: 5. Correct answer: 5.",
    )


def test_build_prompt_contains_every_part():
    p = build_prompt(_req(), max_context_chars=2000)
    for part in (
        "What is 2 + 3?",
        "Verifier: states the final answer",
        "the solver said: add 2 and 3",
        "ANSWER: 5",
        "Program output: 5. Correct answer: 5.",
        "PROCESS_SCORE: N",
    ):
        assert part in p


def test_build_prompt_keeps_the_tail_of_a_long_context():
    context = "HEAD" + "x" * 500 + "TAIL"
    p = build_prompt(_req(context), max_context_chars=100)
    assert "TAIL" in p and "HEAD" not in p
    assert "..." + "x" * 96 + "TAIL" in p  # the last 100 characters, marked as cut
    assert "x" * 97 not in p
