"""MathChat problems: generated deterministically from a seed (multi-step arithmetic and number
theory, exact integer answers) with disjoint train / held-out splits, or loaded from JSONL."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence, Set
from pathlib import Path

from infra.errors import UsageError
from pipelines.base import Problem
from pipelines.records import check_fields, records

NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"]
ITEMS = ["apples", "books", "coins", "marbles", "pencils", "stamps", "cards", "shells"]


def _arith(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(2, 99), r.randint(2, 99)
    op = r.choice(["+", "-", "*"])
    return f"Compute {a} {op} {b}.", eval(f"{a}{op}{b}")


def _one_step(r: random.Random) -> tuple[str, int]:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(5, 60), r.randint(2, 30)
    kind = r.randrange(3)
    if kind == 0:
        return f"{n} has {a} {item} and gets {b} more. How many {item} does {n} have?", a + b
    if kind == 1:
        return f"{n} has {a + b} {item} and gives away {b}. How many {item} are left?", a
    return f"{n} buys {a} packs with {b % 9 + 2} {item} each. How many {item} is that?", a * (b % 9 + 2)


def _two_step(r: random.Random) -> tuple[str, int]:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(3, 30), r.randint(2, 12)
    c = r.randint(1, min(40, a * b - 1))  # "left" counts are never negative
    kind = r.randrange(3)
    if kind == 0:
        return (
            f"{n} buys {a} boxes of {item} with {b} {item} in each box, then gives away {c}. "
            f"How many {item} does {n} have left?",
            a * b - c,
        )
    if kind == 1:
        return (
            f"{n} has {a} {item}, finds {c} more, then splits them evenly into {b} bags, keeping "
            f"the remainder. How many {item} are in each bag?",
            (a + c) // b,
        )
    return (
        f"{n} collects {a} {item} a day for {b} days and already had {c}. How many {item} does {n} have now?",
        a * b + c,
    )


def _number_theory(r: random.Random) -> tuple[str, int]:
    kind = r.randrange(4)
    if kind == 0:
        a, m = r.randint(100, 9999), r.randint(3, 19)
        return f"What is the remainder when {a} is divided by {m}?", a % m
    if kind == 1:
        g = r.randint(2, 12)
        a, b = g * r.randint(2, 20), g * r.randint(2, 20)
        return f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)
    if kind == 2:
        m = r.randint(10, 300) * r.randint(3, 40)
        return f"What is the sum of the digits of {m}?", sum(int(d) for d in str(m))
    k, n = r.randint(3, 13), r.randint(50, 500)
    return f"How many multiples of {k} are there from 1 to {n}?", n // k


FAMILIES = {"arith": _arith, "one_step": _one_step, "two_step": _two_step, "number_theory": _number_theory}


def generate(families: Sequence[str], n: int, seed: int, exclude: Set[str] = frozenset()) -> list[Problem]:
    """`n` distinct problems drawn round-robin from `families`, skipping questions in `exclude`."""
    r = random.Random(seed)
    out: list[Problem] = []
    seen = set(exclude)
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f"cannot generate {n} distinct problems from {families}")
        q, a = FAMILIES[families[len(out) % len(families)]](r)
        if q in seen:
            continue
        seen.add(q)
        out.append(Problem(task_id=hashlib.sha1(q.encode()).hexdigest()[:12], question=q, answer=str(a)))
    return out


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file of {"question": str, "answer": integer (or its digits as a string, commas
    allowed)}; errors name the file and line."""
    out = []
    for where, d in records(path):
        check_fields(where, d, {"question": (str,), "answer": (str, int)})
        try:  # one spelling per number ("+7", "1,000" -> "7", "1000"): the verifier's answer is compared as text
            a = str(int(str(d["answer"]).strip().replace(",", "")))
        except ValueError:
            raise UsageError(f"{where}: answer must be an integer, got {json.dumps(d['answer'])}") from None
        q = d["question"]
        out.append(Problem(task_id=hashlib.sha1(q.encode()).hexdigest()[:12], question=q, answer=a))
    return out
