"""A MathChat held-out set phrased unlike the training generator (problems.py), to tell a team that
learned the arithmetic from one that learned the templates: the same kinds of problems (`arith`,
`one_step`: what mathchat-smol trains on) in other wording, the question before its quantities, names
and items problems.py never uses, and numbers outside its ranges (small factors and counts of
containers written as words).

    .venv/bin/python -m pipelines.mathchat.paraphrased --write   # -> experiments/data/mathchat-paraphrased.jsonl

The file is read like any problem file (`teamrl eval RUN --problems FILE`, problems.py `load_jsonl`).
Each generated problem keeps its kind and numbers, so a test recomputes every answer without the text.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

FILE = Path(__file__).resolve().parents[2] / "experiments" / "data" / "mathchat-paraphrased.jsonl"
SEED, SIZE = 0, 100

NAMES = ["Priya", "Tomasz", "Zainab", "Mateo", "Keiko", "Olu", "Rosa", "Sven", "Amara", "Nikolai", "Wen", "Yusuf"]
ITEMS = ["stickers", "buttons", "feathers", "tickets", "crayons", "pebbles", "postcards", "acorns", "beads", "ribbons"]
CONTAINERS = ["jars", "trays", "crates", "tins", "baskets"]
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


@dataclass
class Paraphrased:
    question: str
    answer: int
    kind: str  # add | sub | mul (arith); gain | loss | groups (one_step)
    values: dict[str, int]  # the numbers the question states


def _arith(r: random.Random) -> Paraphrased:
    # problems.py: "Compute a op b." with a, b in 2..99; here three-digit numbers, a small factor in words
    kind = r.choice(["add", "sub", "mul"])
    if kind == "add":
        a, b = r.randint(100, 999), r.randint(100, 999)
        q = r.choice(["What is the sum of {a} and {b}?", "What do you get when {b} is added to {a}?"])
        return Paraphrased(q.format(a=a, b=b), a + b, kind, {"a": a, "b": b})
    if kind == "sub":
        b = r.randint(100, 898)
        a = r.randint(b + 1, 999)
        q = r.choice(["How much greater is {a} than {b}?", "What remains when {b} is subtracted from {a}?"])
        return Paraphrased(q.format(a=a, b=b), a - b, kind, {"a": a, "b": b})
    a, k = r.randint(100, 999), r.randint(2, 9)
    q = r.choice(["What is {w} times {a}?", "What is the product of {a} and {k}?"])
    return Paraphrased(q.format(a=a, k=k, w=WORDS[k]), a * k, kind, {"a": a, "k": k})


def _one_step(r: random.Random) -> Paraphrased:
    # problems.py: "<name> has a <items> and gets b more. How many ...?", totals under 100, b <= 30, packs of
    # 2..10; here 100..500 items, 31..99 given or lost, containers of 11..40
    n, item, kind = r.choice(NAMES), r.choice(ITEMS), r.choice(["gain", "loss", "groups"])
    if kind == "gain":
        a, b = r.randint(100, 400), r.randint(31, 99)
        q = r.choice(
            [
                "How many {item} does {n} own now, having started with {a} and then been given {b}?",
                "What is {n}'s new total of {item}, if {n} had {a} and a neighbour added {b}?",
            ]
        )
        return Paraphrased(q.format(n=n, item=item, a=a, b=b), a + b, kind, {"a": a, "b": b})
    if kind == "loss":
        a, b = r.randint(130, 500), r.randint(31, 99)
        q = r.choice(
            [
                "How many {item} does {n} still have, after starting with {a} and handing {b} to a cousin?",
                "How many {item} are left in {n}'s collection of {a} once {b} of them have been sold?",
            ]
        )
        return Paraphrased(q.format(n=n, item=item, a=a, b=b), a - b, kind, {"a": a, "b": b})
    g, k, box = r.randint(2, 9), r.randint(11, 40), r.choice(CONTAINERS)
    q = r.choice(
        [
            "How many {item} does {n} have in total, with {g} {box} holding {k} {item} apiece?",
            "What is the total count of {item} across {g} {box}, if every one of them holds {k}?",
        ]
    )
    return Paraphrased(q.format(n=n, item=item, g=WORDS[g], box=box, k=k), g * k, kind, {"g": g, "k": k})


FAMILIES = {"arith": _arith, "one_step": _one_step}


def generate(n: int, seed: int) -> list[Paraphrased]:
    """`n` distinct problems, alternating arith and one_step (as mathchat-smol's held-out split does)."""
    r = random.Random(seed)
    out: list[Paraphrased] = []
    seen: set[str] = set()
    while len(out) < n:
        p = list(FAMILIES.values())[len(out) % len(FAMILIES)](r)
        if p.question not in seen:
            seen.add(p.question)
            out.append(p)
    return out


def jsonl(problems: list[Paraphrased]) -> str:
    """The problem file's text: one {"question", "answer"} object a line."""
    return "".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n" for p in problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {FILE.name} (else print it)")
    text = jsonl(generate(SIZE, SEED))
    if not ap.parse_args().write:
        print(text, end="")
        return
    FILE.parent.mkdir(parents=True, exist_ok=True)
    FILE.write_text(text)
    print(f"{SIZE} problems -> {FILE}")


if __name__ == "__main__":
    main()
