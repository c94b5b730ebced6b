"""benchmarks/mars_prompts.py: each edit changes only what it names in prompts laid out as the pipeline lays
them out (SmolLM2's chat template over DeepResearch's messages), and the replay's shares by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import mars_prompts as mp  # noqa: E402
from pipelines.deepresearch import DeepResearch, DeepResearchConfig  # noqa: E402
from pipelines.deepresearch.prompts import FINAL_NOTE, findings_text  # noqa: E402

QUESTION = "Who founded Veltor Press?"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from infra.models import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="module")
def pipe() -> DeepResearch:
    return DeepResearch(DeepResearchConfig(questions=12, eval_size=4, distractors=8, hops=[1], max_tokens=200), 0)


def _s2_last(tok, pipe) -> str:
    """System 2's last prompt of a searched episode, as the run logs it."""
    chat = pipe.system2_chat(QUESTION)
    chat += [
        {"role": "assistant", "content": "SEARCH: Veltor Press PURPOSE: the founder of Veltor Press"},
        {
            "role": "user",
            "content": findings_text("the founder", "- Veltor Press was founded by Ada Vell.") + FINAL_NOTE,
        },
    ]
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_answer_kind_from_the_question_wording():
    assert mp.answer_kind("Who first climbed Mount Kaka?") == "person's name"
    assert mp.answer_kind("In what year was Quarvel Phigor born?") == "year"
    assert mp.answer_kind("In which city was Quarvel Phigor born?") == "city"
    assert mp.answer_kind("Which company does Ada Vell work for?") == "company"
    assert mp.answer_kind("Which mountain rises above Linsaholm?") == "mountain"


def test_system2_edits_change_only_the_episodes_own_turns(tok, pipe):
    prompt = _s2_last(tok, pipe)
    note = FINAL_NOTE.strip()
    assert prompt.count(note) == 3  # two worked episodes and this one

    hinted = mp.kind_hint(prompt, QUESTION)
    assert hinted.count(note) == 2 and hinted.endswith(
        "ANSWER: <the person's name>.<|im_end|>\n<|im_start|>assistant\n"
    )
    again = mp.question_again(prompt, QUESTION)
    assert again.count(note) == 2 and "Final turn: answer 'Who founded Veltor Press?' with ANSWER" in again

    swapped = mp.examples_swapped(prompt, QUESTION)
    assert sorted(swapped) == sorted(prompt)  # the same text, reordered
    order = [swapped.index(s) for s in ("Ada Quill", "Jubb Holdings", QUESTION)]
    assert order[1] < order[0] < order[2] and prompt.index("Ada Quill") < prompt.index("Jubb Holdings")
    with pytest.raises(ValueError, match="two worked episodes"):
        mp.examples_swapped(prompt.split("<|im_start|>user\nQuestion:", 2)[0], QUESTION)

    named = mp.name_example(prompt, QUESTION)
    assert named.count(note) == 4 and named.startswith(prompt[: prompt.index(f"Question: {QUESTION}")])
    assert named.endswith(prompt[prompt.index(f"Question: {QUESTION}") :])
    # the third worked episode comes last, laid out as the pipeline lays out the other two
    order = [named.index(s) for s in ("Jubb Holdings", "Which company does Ada Quill work for?", QUESTION)]
    assert order == sorted(order)
    q, query, purpose, findings, answer = mp.NAME_EPISODE
    laid_out = tok.apply_chat_template(
        [
            {"role": "user", "content": f"Question: {q}"},
            {"role": "assistant", "content": f"SEARCH: {query} PURPOSE: {purpose}"},
            {"role": "user", "content": findings_text(purpose, "\n".join(f"- {f}" for f in findings)) + FINAL_NOTE},
            {"role": "assistant", "content": f"ANSWER: {answer}"},
        ],
        tokenize=False,
    )
    assert laid_out.split("<|im_start|>user\nQuestion:", 1)[1] in named


def test_system1_purpose_pair_keeps_the_instructions_and_the_request(tok, pipe):
    request = ("the founder of Veltor Press", "# Veltor Press\nVeltor Press was founded by Ada Vell.")
    prompt = tok.apply_chat_template(pipe.system1_chat(*request), tokenize=False, add_generation_prompt=True)
    edited = mp.EDITS[1]["purpose-pair"](prompt, QUESTION)
    system = prompt[: prompt.index("<|im_end|>")]
    tail = prompt[prompt.rindex("<|im_start|>user\nPurpose:") :]
    assert edited.startswith(system) and edited.endswith(tail)
    shots = edited[len(system) : -len(tail)]
    assert shots.count(mp.S1_DOC) == 2
    assert shots.index("Quimby Works was founded by Hugo Jax.") < shots.index("Quimby Works was founded in 1712.")
    swapped = mp.EDITS[1]["purpose-pair-swapped"](prompt, QUESTION)
    assert swapped.index("was founded in 1712.<|im_end|>") < swapped.index("by Hugo Jax.<|im_end|>")


def test_replay_scores_each_system_by_hand(tok, pipe):
    s2 = _s2_last(tok, pipe)
    s1 = tok.apply_chat_template(
        pipe.system1_chat("the year", "# Veltor Press"), tokenize=False, add_generation_prompt=True
    )
    table = pd.DataFrame(
        {
            "question": [QUESTION, "In what year was Veltor Press founded?"],
            "answer": ["Ada Vell", "1712"],
            "kind": ["name", "year"],
            "s2_prompt": [s2, s2],
            "s1_prompt": [None, s1],
        }
    )

    # System 2 answers "Ada Vell" except after the kind hint; System 1 copies a sentence with the year
    def generate(prompt: str) -> str:
        if "You are System 1" in prompt:
            return "Veltor Press was founded in 1712."
        return "1712" if "<the person's name>" in prompt or "<the year>" in prompt else "ada vell"

    r = mp.replay(table, generate).set_index(["system", "edit", "kind"])
    assert r.loc[(2, "logged", "name"), "mean"] == 1.0 and r.loc[(2, "logged", "year"), "mean"] == 0.0
    assert r.loc[(2, "kind-hint", "name"), "mean"] == 0.0 and r.loc[(2, "kind-hint", "year"), "mean"] == 1.0
    # the name question's findings hold "Ada Vell": its exact match there, and the year replies
    assert r.loc[(2, "logged", "name"), ["year_reply", "em_when_found", "found"]].tolist() == [0.0, 1.0, 1]
    assert r.loc[(2, "kind-hint", "name"), ["year_reply", "em_when_found", "found"]].tolist() == [1.0, 0.0, 1]
    # System 1 only where the episode had a System-1 prompt: the year question, its answer copied
    assert r.loc[(1, "logged", "year"), "mean"] == 1.0 and r.loc[(1, "logged", "year"), "size"] == 1
    assert (1, "logged", "name") not in r.index
    text = mp.report({"run": r.reset_index()})
    assert "| run | 2 | kind-hint | 0.00 (of 1) | 1.00 (of 1) | 1.00 | 0.00 (of 1) |" in text
    assert "| run | 1 | logged | - | 1.00 (of 1) | - | - |" in text
