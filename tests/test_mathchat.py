"""MathChat problems, code extraction and the upstream-blame rubric (pipelines/mathchat)."""

import re

import pytest

from pipelines.base import Episode, Problem
from pipelines.mathchat import MathChat, MathChatConfig, extract_code
from pipelines.mathchat import problems as gen
from pipelines.mathchat.rubric import blind_rubric_scores, extract_int, last_int, rubric_scores

ALL = ["arith", "two_step", "number_theory"]


def solve(q: str) -> int:
    """An independent solver for the generated templates (regex over the question text)."""
    n = [int(x) for x in re.findall(r"\d+", q)]
    if q.startswith("Compute"):
        a, op, b = re.match(r"Compute (\d+) ([-+*]) (\d+)\.", q).groups()
        return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    if "boxes of" in q:
        return n[0] * n[1] - n[2]
    if "splits them evenly" in q:
        total, bags = n[0] + n[1], n[2]
        return total // bags
    if "a day for" in q:
        return n[0] * n[1] + n[2]
    if "remainder when" in q:
        return n[0] % n[1]
    if "greatest common divisor" in q:
        a, b = n
        while b:
            a, b = b, a % b
        return a
    if "sum of the digits" in q:
        return sum(map(int, str(n[0])))
    if "multiples of" in q:
        return len([x for x in range(1, n[-1] + 1) if x % n[0] == 0])  # "from 1 to N"
    raise AssertionError(f"unknown template: {q}")


def test_generation_is_deterministic_per_seed():
    a, b = gen.generate(ALL, 30, seed=5), gen.generate(ALL, 30, seed=5)
    assert a == b
    assert [p.question for p in gen.generate(ALL, 30, seed=6)] != [p.question for p in a]
    assert len({p.question for p in a}) == 30


def test_answers_are_correct_integers():
    problems = gen.generate(ALL, 300, seed=1)
    for p in problems:
        assert p.answer == str(solve(p.question)), p.question
    # round-robin over the families: Compute / word problem / number theory
    assert [p.question.startswith("Compute") for p in problems[:6]] == [True, False, False] * 2


def test_word_problem_counts_are_not_negative():
    assert all(int(p.answer) >= 0 for p in gen.generate(["two_step"], 512, seed=0))


def test_train_and_eval_splits_are_disjoint():
    mc = MathChat(MathChatConfig(train_size=64, eval_size=16), seed=0)
    train, held_out = mc.problems("train"), mc.problems("eval")
    assert (len(train), len(held_out)) == (64, 16)
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert mc.problems("train") == train  # stable
    with pytest.raises(ValueError, match="split"):
        mc.problems("test")


def test_load_jsonl_good_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"question": "2+2?", "answer": 4}\n\n{"question": "big?", "answer": " 1,234 "}\n')
    got = gen.load_jsonl(f)
    assert [(p.question, p.answer) for p in got] == [("2+2?", "4"), ("big?", "1234")]
    assert got[0].task_id != got[1].task_id


@pytest.mark.parametrize("bad_line", ['{"question": "q"}', '{"question": "q", "answer": "four"}', "not json"])
def test_load_jsonl_bad_line_is_named(tmp_path, bad_line):
    f = tmp_path / "p.jsonl"
    f.write_text('{"question": "ok", "answer": 1}\n' + bad_line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{f}:2:")):
        gen.load_jsonl(f)


def test_load_jsonl_empty_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty file"):
        gen.load_jsonl(tmp_path / "e.jsonl")


@pytest.mark.parametrize(
    "text, code",
    [
        ("Here:\n```python\nprint(1)\n```\nbye", "print(1)"),
        ("```py\nx = 2\nprint(x)\n```", "x = 2\nprint(x)"),
        ("```\nprint(3)\n```", "print(3)"),  # unlabelled fence
        ("```python\nprint(4)\n", "print(4)"),  # unterminated fence: to the end
        ("```python\nprint(5)\n```\n```python\nprint(6)\n```", "print(5)"),  # the first block
        ("print(7)", "print(7)"),  # bare Python
        ("The answer is 7.", None),
        ("```python\n\n```", None),  # an empty block, no print(
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


@pytest.mark.parametrize(
    "text, n",
    [
        ("ANSWER: 1,234", 1234),
        ("so \\boxed{-5}.", -5),
        ("ANSWER: 3 then 9", 3),
        ("I think 4, maybe 6", 6),
        ("no idea", None),
    ],
)
def test_extract_int(text, n):
    assert extract_int(text) == n


def test_last_int():
    assert last_int("x = 3\nresult: 12,000") == 12000 and last_int(None) is None


PROBLEM = Problem("t", "What is the remainder when 100 is divided by 7?", "2")


def episode(solver="Divide 100 by 7 and take the remainder.", output="2", stated="2", verdict=None):
    """A hand-written episode; the verifier replies `verdict` (default `ANSWER: <stated>`) and states `stated`."""
    acts = [
        {"turn": 0, "agent": "solver", "response_text": solver, "tool_output": None},
        {"turn": 1, "agent": "executor", "response_text": "```python\nprint(100 % 7)\n```", "tool_output": output},
        {
            "turn": 2,
            "agent": "verifier",
            "response_text": f"ANSWER: {stated}" if verdict is None else verdict,
            "tool_output": None,
        },
    ]
    return Episode(problem=PROBLEM, episode_id="e", group_id="g", actions=acts, final_answer=stated)


def scores(ep, rubric=rubric_scores):
    return [s for s, _ in rubric(ep)]


FAILURES = [
    ("NO CODE: the reply had no Python code block", 0.0),
    ("TIMEOUT: the program did not finish in time", 1.0),
    ("ERROR: ZeroDivisionError: division by zero", 2.0),
    ("(no output)", 3.0),
]


def test_rubric_all_correct():
    assert scores(episode()) == [10.0, 10.0, 10.0]


@pytest.mark.parametrize("output, executor_score", FAILURES)
@pytest.mark.parametrize("stated", ["", "3"])  # no answer, or a guess
def test_rubric_code_failure_blames_the_executor_and_leaves_the_verifier_unscored(output, executor_score, stated):
    (solver, _), (executor, _), (verifier, why) = rubric_scores(episode(output=output, stated=stated))
    assert executor == executor_score
    assert solver == 6.0  # plan used both quantities (100, 7) but did not reach 2: 2 + 4 * 1.0
    # nothing to report: not the verifier's failure, so no score (a neutral 5 would whiten into a penalty)
    assert verifier is None and why == "not scored: the program gave no result; upstream is at fault"


def test_rubric_verifier_stating_the_truth_after_a_failed_program():
    assert scores(episode(output="ERROR: boom", stated="2")) == [6.0, 2.0, 10.0]


def test_rubric_correct_program_but_verifier_states_something_else():
    solver, executor, verifier = scores(episode(output="2", stated="5"))
    assert (solver, executor, verifier) == (10.0, 10.0, 0.0)
    assert scores(episode(output="2", stated=""))[2] == 0.0  # stating nothing after a correct program too


def test_rubric_wrong_program():
    (_, _), (executor, why), (verifier, verdict) = rubric_scores(episode(output="3", stated="3"))
    assert (executor, why) == (4.0, "program printed 3, expected 2")
    # a faithful report of the wrong output: the executor is at fault, the verifier is not scored
    assert verifier is None and verdict.startswith("not scored: faithfully reported")
    assert scores(episode(output="3", stated="8"))[2] == 2.0  # supported by neither program nor truth
    assert scores(episode(output="3", stated=""))[2] == 3.0  # silent although the program printed a number


def test_rubric_solver_credited_when_its_plan_names_the_answer():
    solver, executor, _ = scores(episode(solver="100 = 14*7 + 2, so it is 2.", output="ERROR: NameError: x", stated=""))
    assert solver == 8.0 and executor == 2.0
    assert scores(episode(solver="No idea.", output="ERROR: boom", stated=""))[0] == 2.0  # used none of the numbers
    assert scores(episode(solver="Take 100 mod 9.", output="4", stated="4"))[0] == 4.0  # one of two: 2 + 4 * 0.5


@pytest.mark.parametrize("output, executor_score", [*FAILURES, ("2", 8.0), ("3", 8.0)])
def test_blind_rubric_executor_is_judged_on_running_and_printing(output, executor_score):
    assert scores(episode(output=output), blind_rubric_scores)[1] == executor_score  # right or wrong alike


@pytest.mark.parametrize(
    "plan, score",
    [
        ("Divide 100 by 7 and take the remainder.", 10.0),
        ("Divide 100 by the divisor.", 6.0),  # one of two: 2 + 8 * 0.5
        ("No idea.", 2.0),
        ("```python\nprint(100 % 7)\n```", 1.0),  # code, not a plan
        ("print(100 % 7)", 1.0),
    ],
)
def test_blind_rubric_solver_is_judged_on_its_plan(plan, score):
    assert scores(episode(solver=plan), blind_rubric_scores)[0] == score


@pytest.mark.parametrize(
    "output, stated, verdict, score",
    [
        ("3", "3", None, 10.0),  # ANSWER: <printed>, faithful (that 3 is wrong is unknown to it)
        ("2", "2", "It is 2.", 6.0),  # faithful, not in the ANSWER format
        ("3", "", "I cannot tell.", 3.0),  # silent although the program printed a number
        ("3", "2", None, 2.0),  # invented a number the program did not print (even the right one)
        ("ERROR: boom", "3", None, None),  # no program result to report: upstream is at fault, not scored
        ("(no output)", "", "nothing", None),
    ],
)
def test_blind_rubric_verifier_is_judged_on_faithfulness(output, stated, verdict, score):
    (_, _), (_, _), (got, why) = blind_rubric_scores(episode(output=output, stated=stated, verdict=verdict))
    assert got == score
    assert (got is None) == why.startswith("not scored:")


def test_blind_rubric_ignores_the_answer():
    for ep in (episode(), episode(output="3", stated="3"), episode(output="ERROR: boom", stated="")):
        other = Episode(Problem("t", PROBLEM.question, "987654"), "e", "g", ep.actions, ep.final_answer)
        assert blind_rubric_scores(ep) == blind_rubric_scores(other)
        assert "987654" not in str(blind_rubric_scores(other))


class _Team:
    """An `Act` whose executor's program prints `printed`; it records the verifier's prompts."""

    def __init__(self, tokenizer, printed: str):
        self.tokenizer, self.printed, self.verifier_prompts = tokenizer, printed, []

    def __call__(self, agent, prompts):
        from infra.engines.types import Generation

        text = {"solver": "Add them.", "executor": f"```python\nprint({self.printed!r})\n```", "verifier": "ANSWER: 7"}
        if agent == "verifier":
            self.verifier_prompts += [p[-1]["content"] for p in prompts]
        ids = self.tokenizer(text[agent], add_special_tokens=False)["input_ids"]
        return [Generation([1], ids, [-0.5] * len(ids), text[agent], False) for _ in prompts]


@pytest.mark.parametrize("printed", ["7", "7" * 3000])
def test_the_verifier_reads_the_program_output_cut_to_its_token_budget(printed):
    from infra.models import ModelConfig, load_tokenizer

    tok = load_tokenizer(ModelConfig(name="tiny"))
    pipe = MathChat(MathChatConfig(output_tokens=64), seed=0)
    team = _Team(tok, printed)
    (ep,) = pipe.run_episodes([Problem("q", "What is 3 + 4?", "7")], ["e"], ["g"], team)
    seen = team.verifier_prompts[0].split("Program output: ", 1)[1]
    assert ep.actions[1]["tool_output"].startswith(printed[:4000])  # the episode keeps what the sandbox returned
    if len(printed) == 1:
        assert seen == "7"
    else:  # thousands of digits: the verifier reads 64 tokens of them and the mark of the cut
        assert seen.endswith(" [output cut]") and seen.startswith("777")
        assert len(tok(seen.removesuffix(" [output cut]"), add_special_tokens=False)["input_ids"]) <= 64
    assert ep.final_answer == "7" and ep.success
