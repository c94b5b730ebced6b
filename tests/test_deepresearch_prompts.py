"""DeepResearch prompts: the worked examples each system sees, and what System 2 reads turn by turn."""

import re

import pytest

from infra.engines.types import Generation
from pipelines.deepresearch import DeepResearch, DeepResearchConfig
from pipelines.deepresearch.corpus import COMPANY_SUFFIXES, SYLLABLES, generate
from pipelines.deepresearch.prompts import (
    FINAL_NOTE,
    S1_EXAMPLES,
    S2_EXAMPLES,
    S2_TWO_SEARCH_EXAMPLE,
    SYSTEM1,
    SYSTEM2,
    parse_turn,
)


def _pipe(**over) -> DeepResearch:
    base = dict(questions=12, eval_size=4, distractors=8, hops=[1], max_tokens=200, max_turns=2, top_k=1)
    cfg = DeepResearchConfig(**base | over)
    return DeepResearch(cfg, seed=0)


def _check_episode(shots: list[dict], example) -> list[dict]:
    """The worked episode `example` opens `shots`: the question, each search and its findings (the final
    note after the last only), the answer copied from the last findings; returns the turns after it."""
    q, searches, answer = example
    assert shots[0] == {"role": "user", "content": f"Question: {q}"}
    for k, (query, purpose, findings) in enumerate(searches, 1):
        search, seen = shots[2 * k - 1 : 2 * k + 1]
        assert [search["role"], seen["role"]] == ["assistant", "user"]
        assert parse_turn(search["content"]) == ("search", query, purpose)
        assert seen["content"].startswith(f"Findings ({purpose}):\n")
        assert seen["content"].endswith(FINAL_NOTE) == (k == len(searches))
        assert all(f"- {f}" in seen["content"] for f in findings)
    reply = shots[2 * len(searches) + 1]
    assert reply["role"] == "assistant" and parse_turn(reply["content"]) == ("answer", answer, "")
    assert answer in " ".join(searches[-1][2])  # the answer is copied, never made up
    return shots[2 * len(searches) + 2 :]


def test_system2_sees_whole_worked_episodes_before_the_question():
    chat = _pipe().system2_chat("Who founded Veltor Mining?")
    assert chat[0] == {"role": "system", "content": SYSTEM2}
    assert chat[-1] == {"role": "user", "content": "Question: Who founded Veltor Mining?"}
    shots = chat[1:-1]
    assert len(shots) == 4 * len(S2_EXAMPLES)
    for example in S2_EXAMPLES:
        shots = _check_episode(shots, example)
    assert shots == []


def test_the_two_search_example_comes_last_and_chains_its_searches():
    chat = _pipe(max_turns=3, two_search_example=True).system2_chat("Who founded Veltor Mining?")
    shots = chat[1:-1]
    for example in S2_EXAMPLES:
        shots = _check_episode(shots, example)
    assert _check_episode(shots, S2_TWO_SEARCH_EXAMPLE) == []
    (_, first_findings), (second_query, _, _) = S2_TWO_SEARCH_EXAMPLE[1][0][1:], S2_TWO_SEARCH_EXAMPLE[1][1]
    assert any(second_query in f for f in first_findings)  # the second search asks about what the first found
    with pytest.raises(ValueError, match="max_turns >= 3"):
        _pipe(max_turns=2, two_search_example=True)
    with pytest.raises(ValueError, match="needs examples"):
        _pipe(max_turns=3, two_search_example=True, examples=False)


def test_system1_sees_a_copied_sentence_before_its_bin():
    chat = _pipe().system1_chat("the founder of Veltor Mining", "# Veltor Mining\nVeltor Mining is a company.")
    assert chat[0] == {"role": "system", "content": SYSTEM1}
    assert (
        chat[-1]["content"] == "Purpose: the founder of Veltor Mining\n\nDocuments:\n# Veltor Mining\n"
        "Veltor Mining is a company."
    )
    assert [m["role"] for m in chat[1:-1]] == ["user", "assistant"] * len(S1_EXAMPLES)
    for (purpose, doc, sentence), (ask, reply) in zip(S1_EXAMPLES, zip(chat[1:-1:2], chat[2:-1:2])):
        assert ask["content"] == f"Purpose: {purpose}\n\nDocuments:\n{doc}"
        assert reply["content"] == sentence and sentence in doc  # word for word


def test_examples_off_leaves_instructions_and_question_only():
    pipe = _pipe(examples=False)
    assert [m["role"] for m in pipe.system2_chat("Q?")] == ["system", "user"]
    assert [m["role"] for m in pipe.system1_chat("p", "t")] == ["system", "user"]


def test_examples_cannot_collide_with_the_generated_corpus():
    """No name in the examples is one the corpus's syllables can spell, and no example answer is a generated
    question's answer (the example year lies before the generator's), so a copied example never scores."""
    episodes = [*S2_EXAMPLES, S2_TWO_SEARCH_EXAMPLE]
    text = " ".join(" ".join([q, *(w for search in s for w in [search[0], *search[2]]), a]) for q, s, a in episodes)
    text += " ".join(p + " " + d for p, d, _ in S1_EXAMPLES)
    words = set(re.findall(r"\b[A-Z][a-z]+", text)) - {"In", "Critics", "The", *COMPANY_SUFFIXES}
    assert {"Quill", "Kimberhaven", "Jubb", "Quimby", "Oxley", "Bramcote"} <= words
    assert not [w for w in words if _spelled_by_syllables(w.lower())] and _spelled_by_syllables("dradra")
    _, problems = generate(0, 300, 200, hops=(1, 2))
    assert not {a for *_, a in episodes} & {p.answer for p in problems}


def _spelled_by_syllables(word: str) -> bool:
    ends = {0}
    for i in range(len(word)):
        if i in ends:
            ends |= {i + len(s) for s in SYLLABLES if word.startswith(s, i)}
    return len(word) in ends


class _Scripted:
    """An `Act`: System 2 searches the first reply, then answers; System 1 copies a fixed sentence."""

    def __init__(self, pipe, tokenizer):
        self.pipe, self.tokenizer, self.prompts = pipe, tokenizer, []

    def __call__(self, agent, prompts):
        self.prompts.append((agent, prompts))
        text = {"system1": "The fact.", "system2": " Somebody PURPOSE: the fact"}[agent]
        if agent == "system2" and len(self.prompts) > 2:
            text = " Nowhere"  # the answer turn (prefilled ANSWER:)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [Generation([1], ids, [-0.5] * len(ids), text, False) for _ in prompts]

    def stage(self, name, fn, *args):
        return fn(*args)


@pytest.mark.parametrize("examples", [True, False])
def test_episode_contexts_carry_examples_findings_and_final_note(examples):
    from infra.models import ModelConfig, load_tokenizer

    tok = load_tokenizer(ModelConfig(name="tiny"))
    pipe = _pipe(examples=examples)
    team = _Scripted(pipe, tok)
    (ep,) = pipe.run_episodes(pipe.problems("eval")[:1], ["e"], ["g"], team)
    first, last = tok.decode(team.prompts[0][1][0]), tok.decode(team.prompts[-1][1][0])
    assert ("Kimberhaven" in first) == examples and first.endswith("SEARCH:")
    assert last.startswith(first) and last.endswith("ANSWER:")
    assert "Findings (the fact):\n- The fact." + FINAL_NOTE in last
    assert ep.final_answer == "Nowhere" and [a["agent"] for a in ep.actions] == ["system2", "system1", "system2"]


def test_the_preset_keeps_replies_to_one_line_and_searches_one_document():
    from flows.config import load_config

    pipe = load_config("deepresearch-smol", []).pipeline
    assert pipe.examples and pipe.stop == ["\n"] and pipe.top_k == 1
    assert DeepResearchConfig().stop == ["\n"]
