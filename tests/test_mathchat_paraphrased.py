"""The paraphrased MathChat held-out set (pipelines/mathchat/paraphrased.py): the shipped file is what
the generator writes, every answer is right, and nothing of it comes from the training generator."""

import re

import pytest

from flows.config import load_config
from pipelines.mathchat import MathChat, paraphrased, problems
from pipelines.mathchat.paraphrased import FILE, SEED, SIZE, generate, jsonl

SET = generate(SIZE, SEED)
# each kind's answer from its numbers, written here apart from the generator
ANSWER = {
    "add": lambda v: v["a"] + v["b"],
    "sub": lambda v: v["a"] - v["b"],
    "mul": lambda v: v["a"] * v["k"],
    "gain": lambda v: v["a"] + v["b"],
    "loss": lambda v: v["a"] - v["b"],
    "groups": lambda v: v["g"] * v["k"],
}
SPELLED = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def test_the_file_is_what_the_generator_writes():
    assert FILE.read_text() == jsonl(SET), "stale: run `.venv/bin/python -m pipelines.mathchat.paraphrased --write`"


def test_load_jsonl_reads_the_file():
    got = problems.load_jsonl(FILE)
    assert [(p.question, p.answer) for p in got] == [(p.question, str(p.answer)) for p in SET]
    assert len({p.task_id for p in got}) == SIZE


def test_every_answer_is_the_exact_integer_its_numbers_give():
    for p in SET:
        assert p.answer == ANSWER[p.kind](p.values) and p.answer > 0, p
        words = re.findall(r"\w+", p.question)
        for v in p.values.values():  # the question states each number, as digits or as a word
            assert str(v) in words or SPELLED.get(v) in words, (v, p.question)


def test_both_trained_families_and_all_kinds_occur():
    kinds = [p.kind for p in SET]
    assert sum(k in ("add", "sub", "mul") for k in kinds) == SIZE // 2
    assert set(kinds) == set(ANSWER)


def test_names_and_items_are_unseen_in_training():
    assert not set(paraphrased.NAMES) & set(problems.NAMES)
    assert not set(paraphrased.ITEMS) & set(problems.ITEMS)
    trained = set(problems.NAMES) | set(problems.ITEMS)
    assert not any(trained & set(re.findall(r"\w+", p.question)) for p in SET)


@pytest.mark.parametrize("preset", ["tiny", "mathchat-smol", "mathchat-gpu"])
def test_no_question_occurs_in_the_training_generator(preset):
    """Not in any split the MathChat presets generate for the training seeds of experiments/ (0-4)."""
    ours = {p.question for p in SET}
    for seed in range(5):
        cfg = load_config(preset, [f"seed={seed}"])
        team = MathChat(cfg.pipeline, cfg.seed)
        for split in ("train", "eval"):
            assert not ours & {p.question for p in team.problems(split)}, (preset, seed, split)
