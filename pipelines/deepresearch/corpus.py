"""DeepResearch corpus: an offline world of fictional people, companies, cities and mountains, one
document each, with exact-answer questions over chains of 1-4 documents, generated deterministically
from a seed; or a user-supplied corpus loaded from JSONL.

Every fact is stated once, in its subject's own document, among entity-specific filler sentences.
Every relation is functional (a company has one founder, a person one birthplace, ...) and every name
is unique, so "In which city was the founder of Veltor Mining born?" has exactly one answer.
Lengths are counted in approximate tokens: whitespace words * 1.3 (`approx_tokens`)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import UsageError
from pipelines.base import Problem
from pipelines.records import check_fields, records

SYLLABLES = (
    "vel tor mar dra ven il sa quar no bek ost ra lin dus ka ther om phi zan gor el wyn "
    "tas ru bri sel mok tha cor ny ves pa lu dor fen"
).split()
COMPANY_SUFFIXES = ["Holdings", "Works", "Mining", "Shipping", "Textiles", "Foundry", "Press", "Trading"]
CITY_SUFFIXES = ["port", "holm", "ford", "vale", "burg", "wick"]
INTRO = {
    "person": "{n} is a person of some renown.",
    "company": "{n} is a company.",
    "city": "{n} is a city.",
    "mountain": "{n} is a mountain.",
}
# relation: (subject kind, object kind or "year", fact, noun phrase for chains, final question)
RELATIONS = {
    "founder": ("company", "person", "{s} was founded by {o}.", "the founder of {s}", "Who founded {s}?"),
    "hq": (
        "company",
        "city",
        "The headquarters of {s} are in the city of {o}.",
        "the city where {s} has its headquarters",
        "In which city does {s} have its headquarters?",
    ),
    "founded": ("company", "year", "{s} was founded in {o}.", "", "In what year was {s} founded?"),
    "birthplace": (
        "person",
        "city",
        "{s} was born in the city of {o}.",
        "the birthplace of {s}",
        "In which city was {s} born?",
    ),
    "employer": ("person", "company", "{s} works for {o}.", "the employer of {s}", "Which company does {s} work for?"),
    "born": ("person", "year", "{s} was born in {o}.", "", "In what year was {s} born?"),
    "mayor": ("city", "person", "The mayor of {s} is {o}.", "the mayor of {s}", "Who is the mayor of {s}?"),
    "mountain": (
        "city",
        "mountain",
        "{s} lies at the foot of {o}.",
        "the mountain that rises above {s}",
        "Which mountain rises above {s}?",
    ),
    "settled": ("city", "year", "{s} was first settled in {o}.", "", "In what year was {s} first settled?"),
    "climber": (
        "mountain",
        "person",
        "{s} was first climbed by {o}.",
        "the first person to climb {s}",
        "Who first climbed {s}?",
    ),
    "climbed": ("mountain", "year", "{s} was first climbed in {o}.", "", "In what year was {s} first climbed?"),
}
FILLER = [
    "{n} is often mentioned in accounts of the {a} {t} of the region.",
    "Local records describe {n} in connection with a {a} {x}.",
    "Several travellers wrote about {n} and a {a} {x} they saw there.",
    "A short history of {n} devotes a whole chapter to {t}.",
    "Critics have compared {n} to a {a} {x}.",
    "The archive on {n} holds many letters about {t}.",
    "Stories told about {n} tend to concern {t} and a {a} {x}.",
    "Little is written about {n} that does not touch on {t}.",
]
ADJECTIVES = "quiet old famous curious bright narrow distant modest stubborn gentle painted hidden".split()
THINGS = "bridge garden market lantern harbor library orchard festival workshop carriage tower ferry".split()
TOPICS = [
    "weaving",
    "winter storms",
    "folk music",
    "salt trading",
    "clockmaking",
    "river fishing",
    "glassblowing",
    "old maps",
    "beekeeping",
    "printing",
    "local dialects",
    "rope making",
]


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class ResearchProblem(Problem):
    hops: int = 1  # documents to chain from the question to the answer
    support: tuple[str, ...] = ()  # their doc ids, in chain order
    docs: str = ""  # the documents file it is asked over (`eval --docs`); "": the run's corpus


@dataclass
class _Entity:
    kind: str
    name: str
    stem: str  # shared by near-miss siblings (surname, company or city stem)
    facts: dict[str, str] = field(default_factory=dict)


def approx_tokens(text: str) -> int:
    """Approximate token count of `text`: whitespace words * 1.3, rounded."""
    return round(1.3 * len(text.split()))


def _word(r: random.Random) -> str:
    return "".join(r.choice(SYLLABLES) for _ in range(r.randint(2, 3))).capitalize()


def _world(r: random.Random, size: int) -> list[_Entity]:
    """`size` entities cycling through the kinds; about 40% reuse a stem of an earlier one (near-misses)."""
    kinds = ["person", "company", "city", "mountain"]
    out: list[_Entity] = []
    used: set[str] = set()
    stems: dict[str, list[str]] = {k: [] for k in kinds}
    while len(out) < size:
        kind = kinds[len(out) % 4]
        stem = r.choice(stems[kind]) if stems[kind] and r.random() < 0.4 else _word(r)
        name = {
            "person": f"{_word(r)} {stem}",
            "company": f"{stem} {r.choice(COMPANY_SUFFIXES)}",
            "city": stem + r.choice(CITY_SUFFIXES),
            "mountain": r.choice([f"Mount {stem}", f"{stem} Peak", f"{stem} Ridge"]),
        }[kind]
        if name.lower() not in used:
            used.add(name.lower())
            stems[kind].append(stem)
            out.append(_Entity(kind, name, stem))
    by_kind = {k: [e.name for e in out if e.kind == k] for k in kinds}
    for e in out:
        for rel, (subj, obj, *_) in RELATIONS.items():
            if subj == e.kind:
                e.facts[rel] = str(r.randint(1600, 1990)) if obj == "year" else r.choice(by_kind[obj])
    assert len({e.name.lower() for e in out}) == len(out), "entity names must be unique"
    return out


def _chain(r: random.Random, world: dict[str, _Entity], start: _Entity, hops: int) -> tuple[str, str, list[str]] | None:
    """A random walk over `hops` distinct entities: (question, answer, entity names), or None if stuck."""
    chain, subject = [start], start.name
    while True:
        last = chain[-1]
        names = {e.name for e in chain}
        steps = [
            rel
            for rel, v in last.facts.items()
            if v not in names and (len(chain) == hops or RELATIONS[rel][1] != "year")
        ]
        if not steps:
            return None
        rel = r.choice(steps)
        if len(chain) == hops:
            return RELATIONS[rel][4].format(s=subject), last.facts[rel], [e.name for e in chain]
        subject = RELATIONS[rel][3].format(s=subject)
        chain.append(world[last.facts[rel]])


def _text(r: random.Random, e: _Entity, target: int, max_tokens: int) -> str:
    """Intro and facts, with filler sentences inserted at random places until about `target` tokens."""
    body = [RELATIONS[rel][2].format(s=e.name, o=v) for rel, v in e.facts.items()]
    words = sum(len(s.split()) for s in body) + len(INTRO[e.kind].split())
    while round(1.3 * words) < target:
        s = r.choice(FILLER).format(n=e.name, a=r.choice(ADJECTIVES), x=r.choice(THINGS), t=r.choice(TOPICS))
        if round(1.3 * (words + len(s.split()))) > max_tokens:
            break
        body.insert(r.randint(0, len(body)), s)
        words += len(s.split())
    return " ".join([INTRO[e.kind].format(n=e.name), *body])


def generate(
    seed: int,
    n_questions: int,
    n_distractors: int,
    min_tokens: int = 50,
    max_tokens: int = 2000,
    hops: tuple[int, ...] = (1, 2, 3, 4),
) -> tuple[list[Document], list[ResearchProblem]]:
    """A fictional corpus and `n_questions` distinct questions, hop counts cycling through `hops`.

    The corpus holds every question's support documents plus `n_distractors` others (near-miss
    siblings of support entities first), shuffled; lengths are log-uniform in [min_tokens, max_tokens]
    (a document's facts are never cut, so a few may exceed a tiny `min_tokens` target)."""
    if not 0 < min_tokens <= max_tokens or not hops or min(hops) < 1:
        raise ValueError("need 0 < min_tokens <= max_tokens and hop counts >= 1")
    r = random.Random(seed)
    entities = _world(r, max(hops) * n_questions + n_distractors + 20)
    world = {e.name: e for e in entities}
    questions: dict[str, tuple[str, int, list[str]]] = {}  # question -> (answer, hops, support names)
    tries = 0
    while len(questions) < n_questions:
        tries += 1
        if tries > 1000 * n_questions:
            raise ValueError(f"cannot generate {n_questions} distinct questions")
        h = hops[len(questions) % len(hops)]
        found = _chain(r, world, r.choice(entities), h)
        if found and found[0] not in questions:
            questions[found[0]] = (found[1], h, found[2])
    support = {name for _, _, names in questions.values() for name in names}
    stems = {(world[n].kind, world[n].stem) for n in support}
    others = sorted(
        (e for e in entities if e.name not in support), key=lambda e: ((e.kind, e.stem) not in stems, r.random())
    )
    if len(others) < n_distractors:
        raise ValueError(f"cannot pick {n_distractors} distractors")
    chosen = [world[n] for n in sorted(support)] + others[:n_distractors]
    r.shuffle(chosen)
    lo, hi = math.log(min_tokens), math.log(max_tokens)
    docs = [
        Document(f"doc{i:05d}", e.name, _text(r, e, round(math.exp(r.uniform(lo, hi))), max_tokens))
        for i, e in enumerate(chosen)
    ]
    ids = {d.title: d.doc_id for d in docs}
    return docs, [
        ResearchProblem(task_id=_task_id(q), question=q, answer=a, hops=h, support=tuple(ids[n] for n in names))
        for q, (a, h, names) in questions.items()
    ]


def answer_kind(answer: str) -> str:
    """ "year" for an answer of four digits (every generated year), else "name"."""
    return "year" if re.fullmatch(r"\d{4}", answer.strip()) else "name"


def split(problems: list[ResearchProblem], eval_size: int) -> tuple[list[ResearchProblem], list[ResearchProblem]]:
    """(train, eval): the held-out split is the last `eval_size` problems, as in MathChat."""
    if not 0 <= eval_size <= len(problems):
        raise ValueError(f"eval_size {eval_size} not in [0, {len(problems)}]")
    cut = len(problems) - eval_size
    return problems[:cut], problems[cut:]


def _task_id(question: str) -> str:
    return hashlib.sha1(question.encode()).hexdigest()[:12]


def _require(where: str, d: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise UsageError(f"{where}: missing key(s) {', '.join(missing)}")
    empty = [k for k in keys if not str(d[k]).strip()]
    if empty:
        raise UsageError(f"{where}: empty {', '.join(empty)}")


def load_docs(path: str | Path) -> list[Document]:
    """Documents {"id", "title"?, "text"}, one JSON object a line; errors name the file and line."""
    docs: dict[str, Document] = {}
    for where, d in records(path):
        _require(where, d, ("id", "text"))
        if (doc_id := str(d["id"])) in docs:
            raise UsageError(f"{where}: duplicate document id {doc_id!r}")
        docs[doc_id] = Document(doc_id, str(d.get("title", "")), str(d["text"]))
    return list(docs.values())


def load_jsonl(docs_path: str | Path, questions_path: str | Path) -> tuple[list[Document], list[ResearchProblem]]:
    """A user corpus: documents (`load_docs`) and questions {"question", "answer", "hops"?,
    "support"?: [doc ids]}, one JSON object a line; errors name the file and line."""
    docs = {d.doc_id: d for d in load_docs(docs_path)}
    problems: dict[str, ResearchProblem] = {}
    for where, d in records(questions_path):
        _require(where, d, ("question", "answer"))
        support = d.get("support", [])
        if not isinstance(support, list):
            raise UsageError(f"{where}: support must be a list of document ids, got {support!r}")
        if unknown := [str(s) for s in support if str(s) not in docs]:
            raise UsageError(f"{where}: support id(s) {', '.join(unknown)} not in {docs_path}")
        try:
            hops = int(d.get("hops", max(len(support), 1)))
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: hops must be an integer: {e}") from e
        if (q := str(d["question"]).strip()) in problems:
            raise UsageError(f"{where}: duplicate question {q!r}")
        problems[q] = ResearchProblem(
            task_id=_task_id(q),
            question=q,
            answer=str(d["answer"]).strip(),
            hops=hops,
            support=tuple(str(s) for s in support),
        )
    return list(docs.values()), list(problems.values())


def load_questions(path: str | Path, docs_path: str | Path | None = None) -> list[ResearchProblem]:
    """Questions to evaluate a team on, {"question": str, "answer": str or integer}, one JSON object a line,
    asked over the documents of `docs_path` (see `load_docs`; checked here) or else the run's corpus."""
    docs = str(Path(docs_path).resolve()) if docs_path else ""
    if docs:
        load_docs(docs)
    out = []
    for where, d in records(path):
        check_fields(where, d, {"question": (str,), "answer": (str, int)})
        q = d["question"].strip()
        out.append(ResearchProblem(task_id=_task_id(q), question=q, answer=str(d["answer"]).strip(), docs=docs))
    return out


def write_jsonl(
    docs: list[Document], problems: list[ResearchProblem], docs_path: str | Path, questions_path: str | Path
) -> None:
    """Export a corpus in the format `load_jsonl` reads back identically."""
    Path(docs_path).write_text(
        "".join(json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) + "\n" for d in docs)
    )
    Path(questions_path).write_text(
        "".join(
            json.dumps({"question": p.question, "answer": p.answer, "hops": p.hops, "support": list(p.support)}) + "\n"
            for p in problems
        )
    )
