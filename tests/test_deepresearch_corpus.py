"""DeepResearch data layer: the generated fictional corpus, its JSONL format, and BM25 search."""

import hashlib
import re
from collections import Counter

import pytest

from pipelines.deepresearch.corpus import (
    Document,
    ResearchProblem,
    approx_tokens,
    generate,
    load_jsonl,
    split,
    write_jsonl,
)
from pipelines.deepresearch.search import SearchIndex


@pytest.fixture(scope="module")
def world():
    return generate(seed=3, n_questions=120, n_distractors=300)


def test_deterministic_from_seed():
    assert generate(5, 20, 30) == generate(5, 20, 30)
    assert generate(5, 20, 30) != generate(6, 20, 30)


def test_lengths_spread_between_bounds(world):
    lengths = [approx_tokens(d.text) for d in world[0]]
    assert 50 <= min(lengths) and max(lengths) <= 2000
    assert min(lengths) < 150 and max(lengths) > 1000
    small = generate(1, 8, 20, min_tokens=100, max_tokens=300)[0]
    assert all(100 <= approx_tokens(d.text) <= 300 for d in small)


def test_support_chains_hold_the_answers(world):
    docs, problems = world
    by_id = {d.doc_id: d for d in docs}
    for p in problems:
        assert len(p.support) == p.hops == len(set(p.support))
        chain = [by_id[i] for i in p.support]
        assert chain[0].title in p.question  # the chain starts at the named entity
        assert p.answer in chain[-1].text  # and ends at the document stating the answer
        for a, b in zip(chain, chain[1:]):  # each hop names the next document's entity
            assert b.title in a.text
        assert p.task_id == hashlib.sha1(p.question.encode()).hexdigest()[:12]
    assert len({p.question for p in problems}) == len(problems)


def test_hop_mix_and_corpus_size(world):
    docs, problems = world
    assert Counter(p.hops for p in problems) == {1: 30, 2: 30, 3: 30, 4: 30}
    assert {p.hops for p in generate(2, 10, 5, hops=(2, 3))[1]} == {2, 3}
    support = {i for p in problems for i in p.support}
    assert len(docs) == len(support) + 300
    assert len({d.doc_id for d in docs}) == len(docs)


def test_names_unique_with_near_misses(world):
    titles = [d.title for d in world[0]]
    assert len({t.lower() for t in titles}) == len(titles)
    surnames = Counter(t.split()[-1] for t in titles if len(t.split()) == 2)
    assert sum(c > 1 for c in surnames.values()) >= 10  # shared surnames / company stems


def test_split_is_disjoint_and_deterministic(world):
    problems = world[1]
    train, held = split(problems, 20)
    assert len(held) == 20 and len(train) == len(problems) - 20
    assert not {p.task_id for p in train} & {p.task_id for p in held}
    assert train + held == problems and split(problems, 20) == (train, held)
    assert split(problems, 0) == (problems, [])
    with pytest.raises(ValueError):
        split(problems, len(problems) + 1)


def test_jsonl_round_trip(tmp_path):
    docs, problems = generate(9, 12, 10)
    write_jsonl(docs, problems, tmp_path / "d.jsonl", tmp_path / "q.jsonl")
    assert load_jsonl(tmp_path / "d.jsonl", tmp_path / "q.jsonl") == (docs, problems)


def test_load_defaults(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"id": "a", "text": "Alpha."}\n\n{"id": "b", "text": "Beta."}\n')
    (tmp_path / "q.jsonl").write_text(
        '{"question": "Q1?", "answer": " x "}\n{"question": "Q2?", "answer": 1907, "support": ["a", "b"]}\n'
    )
    docs, problems = load_jsonl(tmp_path / "d.jsonl", tmp_path / "q.jsonl")
    assert docs == [Document("a", "", "Alpha."), Document("b", "", "Beta.")]
    assert problems[0] == ResearchProblem(
        task_id=hashlib.sha1(b"Q1?").hexdigest()[:12], question="Q1?", answer="x", hops=1, support=()
    )
    assert (problems[1].answer, problems[1].hops, problems[1].support) == ("1907", 2, ("a", "b"))


GOOD_DOCS = ['{"id": "a", "text": "Alpha."}', '{"id": "b", "title": "B", "text": "Beta."}']
GOOD_QS = ['{"question": "Q1?", "answer": "x", "support": ["a"]}', '{"question": "Q2?", "answer": "y"}']


@pytest.mark.parametrize(
    "docs, qs, where, message",
    [
        (GOOD_DOCS + ['{"id": "c", "text": '], GOOD_QS, "d.jsonl:3", "invalid JSON"),
        (['["a", "b"]'], GOOD_QS, "d.jsonl:1", "JSON object"),
        (GOOD_DOCS + ['{"id": "c"}'], GOOD_QS, "d.jsonl:3", "missing key"),
        (['{"text": "Alpha."}'], GOOD_QS, "d.jsonl:1", "missing key"),
        (GOOD_DOCS + ['{"id": "c", "text": "  "}'], GOOD_QS, "d.jsonl:3", "empty text"),
        (GOOD_DOCS + ['{"id": "a", "text": "Again."}'], GOOD_QS, "d.jsonl:3", "duplicate document id"),
        ([], GOOD_QS, "d.jsonl", "empty file"),
        (GOOD_DOCS, [GOOD_QS[0], "{oops"], "q.jsonl:2", "invalid JSON"),
        (GOOD_DOCS, [GOOD_QS[0], '{"question": "Q2?"}'], "q.jsonl:2", "missing key"),
        (GOOD_DOCS, ['{"answer": "x"}'], "q.jsonl:1", "missing key"),
        (GOOD_DOCS, ['{"question": "Q?", "answer": ""}'], "q.jsonl:1", "empty answer"),
        (
            GOOD_DOCS,
            [GOOD_QS[0], '{"question": "Q2?", "answer": "y", "support": ["a", "zz"]}'],
            "q.jsonl:2",
            "zz not in",
        ),
        (GOOD_DOCS, ['{"question": "Q?", "answer": "x", "support": "a"}'], "q.jsonl:1", "support must be a list"),
        (GOOD_DOCS, ['{"question": "Q?", "answer": "x", "hops": "two"}'], "q.jsonl:1", "hops must be an integer"),
        (GOOD_DOCS, GOOD_QS + [GOOD_QS[0]], "q.jsonl:3", "duplicate question"),
        (GOOD_DOCS, ["", "  "], "q.jsonl", "empty file"),
    ],
)
def test_load_errors_name_file_and_line(tmp_path, docs, qs, where, message):
    (tmp_path / "d.jsonl").write_text("".join(line + "\n" for line in docs))
    (tmp_path / "q.jsonl").write_text("".join(line + "\n" for line in qs))
    with pytest.raises(ValueError, match=re.escape(where) + r"\b.*" + re.escape(message)):
        load_jsonl(tmp_path / "d.jsonl", tmp_path / "q.jsonl")


def test_bm25_finds_one_hop_support(world):
    docs, problems = world
    index = SearchIndex(docs)
    one_hop = [p for p in problems if p.hops == 1]
    hits = [p.support[0] in [d.doc_id for d in index.search(p.question, 3)] for p in one_hop]
    assert len(one_hop) == 30 and sum(hits) / len(hits) >= 0.8
    assert index.search(problems[0].question, 3) == index.search(problems[0].question, 3)


def test_bm25_edge_cases():
    docs = [
        Document("a", "Osk", "Osk lies north."),
        Document("b", "Osk", "Osk lies north."),
        Document("c", "Vel", "Vel lies south of Osk."),
        Document("d", "Tor", "Nothing here."),
    ]
    index = SearchIndex(docs)
    assert index.search("", 5) == [] and index.search("what is the", 5) == [] and index.search("osk", 0) == []
    assert index.search("zzz", 5) == []
    assert [d.doc_id for d in index.search("Where is Osk?", 10)] == ["a", "b", "c"]  # ties in corpus order
    assert [d.doc_id for d in index.search("osk north", 1)] == ["a"]
    assert SearchIndex([]).search("osk", 3) == []


def test_training_questions_can_be_restricted_to_an_answer_kind():
    """`train_answers`: a curriculum over the training split only; the held-out questions stay as they are."""
    from pipelines.deepresearch import DeepResearch
    from pipelines.deepresearch.config import DeepResearchConfig
    from pipelines.deepresearch.corpus import answer_kind

    small = {"questions": 60, "eval_size": 20, "distractors": 10, "hops": [1]}
    both = DeepResearch(DeepResearchConfig(**small), 0)
    names = DeepResearch(DeepResearchConfig(**small, train_answers=["name"]), 0)
    assert [answer_kind(a) for a in ("1712", " 1600 ", "Mira Dask", "Velport", "17")] == [
        "year",
        "year",
        "name",
        "name",
        "name",
    ]
    kinds = Counter(answer_kind(p.answer) for p in both.problems("train"))
    assert kinds["year"] > 0 and kinds["name"] > 0
    assert names.problems("train") == [p for p in both.problems("train") if answer_kind(p.answer) == "name"]
    assert names.problems("eval") == both.problems("eval")


def test_a_curriculum_with_no_training_question_is_refused(tmp_path):
    import json

    from pydantic import ValidationError

    from pipelines.deepresearch import DeepResearch
    from pipelines.deepresearch.config import DeepResearchConfig

    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "q", "text": "Quill Works was founded by Mira Dask."}) + "\n")
    qs = [{"question": f"Who founded Quill Works {i}?", "answer": "Mira Dask"} for i in range(3)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    files = {"docs_file": str(tmp_path / "d.jsonl"), "questions_file": str(tmp_path / "q.jsonl"), "eval_size": 1}
    with pytest.raises(ValueError, match=r"no training question asks for a year \(pipeline.train_answers\)"):
        DeepResearch(DeepResearchConfig(**files, train_answers=["year"]), 0).problems("train")
    with pytest.raises(ValidationError, match="train_answers"):
        DeepResearchConfig(train_answers=["city"])
