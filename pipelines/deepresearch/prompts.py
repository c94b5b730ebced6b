"""What the two systems read besides the tool output, and how System 2's replies are read: the
instructions of each system, the worked examples shown as earlier chat turns (`examples`), the note of the
final turn, the chat messages built from them, and `parse_turn`. The wording is what a small model is most
sensitive to, so it lives apart from the play loop (__init__.py), to be read and tested on its own
(tests/test_deepresearch_prompts.py).
"""

from __future__ import annotations

import re

SYSTEM2 = (
    "You answer questions about people, companies, cities and mountains that only a private search "
    "engine knows. Reply with one line, one of:\n"
    "SEARCH: <names from the question> PURPOSE: <the fact you need>\n"
    "PYTHON: <one line of Python that prints a result> PURPOSE: <why>\n"
    "ANSWER: <a name, a city or a year, copied from the findings>"
)
SYSTEM1 = (
    "You are System 1. Find the sentence in the documents that states the fact named in the purpose "
    "and copy it word for word. Reply NONE if there is no such sentence."
)
FINAL_NOTE = "\nFinal turn: reply with ANSWER: <answer>."
# Worked examples (`examples`), about entities whose names the corpus's syllables cannot spell, with a year
# before the generator's 1600..1990: a 135M model copies the shape of an earlier turn far more reliably than it
# follows an instruction, and an answer copied from an example can never be right by chance.
# (question, [(search, purpose, findings), ...], answer): findings as System 1 would write them, with a
# distractor fact after the answer's in one and before it in the other, so neither position is the one to copy
S2_EXAMPLES = [
    (
        "In which city was Ada Quill born?",
        [
            (
                "Ada Quill",
                "the city where Ada Quill was born",
                ["Ada Quill was born in the city of Kimberhaven.", "Ada Quill works for Hexley Press."],
            )
        ],
        "Kimberhaven",
    ),
    (
        "In what year was Jubb Holdings founded?",
        [
            (
                "Jubb Holdings",
                "the year Jubb Holdings was founded",
                ["Jubb Holdings was founded by Ezra Wick.", "Jubb Holdings was founded in 1543."],
            )
        ],
        "1543",
    ),
]
# `two_search_example`: a 2-hop episode whose first findings name the entity the second search asks about;
# with only one-search examples, an untrained team searched once in every episode and never reached a 2-hop answer
S2_TWO_SEARCH_EXAMPLE = (
    "In which city was the founder of Oxley Foundry born?",
    [
        (
            "Oxley Foundry",
            "the founder of Oxley Foundry",
            ["Oxley Foundry was founded in 1588.", "Oxley Foundry was founded by Hugo Jax."],
        ),
        (
            "Hugo Jax",
            "the city where Hugo Jax was born",
            ["Hugo Jax was born in the city of Bramcote.", "Hugo Jax works for Oxley Foundry."],
        ),
    ],
    "Bramcote",
)
# (purpose, document, the sentence to copy)
S1_EXAMPLES = [
    (
        "the founder of Quimby Works",
        "# Quimby Works\nQuimby Works is a company. Critics have compared Quimby Works to a quiet bridge. "
        "The headquarters of Quimby Works are in the city of Exmouth. Quimby Works was founded by Hugo "
        "Jax. Quimby Works was founded in 1712.",
        "Quimby Works was founded by Hugo Jax.",
    )
]
TURN_RE = re.compile(r"\b(SEARCH|PYTHON|ANSWER)\s*:\s*", re.I)
PURPOSE_RE = re.compile(r"\s*\bPURPOSE\s*:\s*", re.I)


def parse_turn(text: str) -> tuple[str, str, str]:
    """(kind, argument, purpose): kind is search | python | answer (the first keyword in the reply)
    or none; the argument runs to the end of its line or to PURPOSE:, the purpose to the line's end
    (empty when missing)."""
    m = TURN_RE.search(text or "")
    if not m:
        return "none", "", ""
    line = text[m.end() :].split("\n", 1)[0]
    arg, *purpose = PURPOSE_RE.split(line, maxsplit=1)
    return m.group(1).lower(), arg.strip().strip("`"), "".join(purpose).strip()


def user_message(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant_message(content: str) -> dict:
    return {"role": "assistant", "content": content}


def s1_request(purpose: str, text: str) -> str:
    return f"Purpose: {purpose}\n\nDocuments:\n{text}"


def findings_text(purpose: str, observation: str) -> str:
    """What System 2 reads after a tool call: its purpose and what came back."""
    return f"Findings ({purpose}):\n{observation}"
