"""MathChat: Problem Solver -> Code Executor (Python in the sandbox) -> Verifier (final answer)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.sandbox import SandboxConfig, preflight, run_python, sandbox_fault
from pipelines.base import (
    Act,
    AgentSpec,
    Episode,
    PipelineBase,
    Problem,
    action_row,
    clip_tokens,
    extract_code,
    own_weights,
)
from pipelines.mathchat import problems as gen
from pipelines.mathchat.rubric import blind_rubric_scores, extract_int, last_int, rubric_scores
from pipelines.records import no_docs

Family = Literal["arith", "one_step", "two_step", "number_theory"]  # gen.FAMILIES


# a function, as mypy types a lambda's list of names list[str], not list[Family]
def _default_families() -> list[Family]:
    return ["two_step", "number_theory"]


class MathChatConfig(BaseModel):
    """The MathChat team and its problem sets."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["mathchat"] = "mathchat"
    families: list[Family] = Field(
        default_factory=_default_families,
        min_length=1,
        description="problem families mixed round-robin (easiest first): arith | one_step | two_step | number_theory",
    )
    train_size: int = Field(512, ge=1, description="generated training problems")
    eval_size: int = Field(100, ge=1, description="generated held-out problems (disjoint from train)")
    problems_file: str | None = Field(
        None,
        description="JSONL of {question, answer}: replaces the generated "
        "train split (the held-out split is its last `eval_size` lines)",
    )
    max_new_tokens: dict[str, int] = Field(
        default_factory=lambda: {"solver": 48, "executor": 96, "verifier": 24},
        description="response token budget per agent",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits for the executor's code")
    output_tokens: int = Field(
        256,
        ge=16,
        description="the program output the verifier reads, in tokens; longer output is cut there (the "
        "episode keeps what the sandbox returned), so a program printing thousands of digits cannot blow up "
        "the verifier's prompt and its training step",
    )


SOLVER = "You are the Problem Solver. In one or two short sentences, say how to compute the answer. Do not write code."
EXECUTOR = (
    "You are the Code Executor. Reply with only a short Python program in a ```python block that prints the answer."
)
CUT = " [output cut]"  # after a program output cut to `output_tokens`
VERIFIER = "You are the Verifier. Check the program output and reply with: ANSWER: <integer>"


class MathChat(PipelineBase):
    name = "mathchat"
    Config: type[BaseModel] = MathChatConfig
    answer_blind_rubric = True
    agents = [
        AgentSpec("solver", "Problem Solver: explains how to compute the answer"),
        AgentSpec(
            "executor", "Code Executor: writes Python that prints the answer; it is run, stdout/stderr is feedback"
        ),
        AgentSpec("verifier", "Verifier: checks the program output and states the final integer answer"),
    ]
    weights = own_weights(agents)

    def __init__(self, cfg: MathChatConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        preflight(cfg.sandbox)  # fail now, not mid-rollout, if strict isolation cannot run here

    def problems(self, split: str) -> list[Problem]:
        if self.cfg.problems_file:
            allp = gen.load_jsonl(self.cfg.problems_file)
            if len(allp) <= self.cfg.eval_size:
                raise ValueError(
                    f"{self.cfg.problems_file}: {len(allp)} problems, need more than eval_size={self.cfg.eval_size}"
                )
            return allp[-self.cfg.eval_size :] if split == "eval" else allp[: -self.cfg.eval_size]
        train = gen.generate(self.cfg.families, self.cfg.train_size, seed=self.seed)
        if split == "train":
            return train
        if split == "eval":
            return gen.generate(
                self.cfg.families, self.cfg.eval_size, seed=self.seed + 7919, exclude={p.question for p in train}
            )
        raise ValueError(f"unknown split {split!r}: train | eval")

    def load_problems(self, path: str, docs: str | None = None) -> list[Problem]:
        """A user's problems {"question", "answer": integer} (pipelines/mathchat/problems.py `load_jsonl`)."""
        no_docs(self.name, docs)
        return gen.load_jsonl(path)

    def run_episodes(
        self, problems: Sequence[Problem], episode_ids: list[str], group_ids: list[str], act: Act
    ) -> list[Episode]:
        eps = [Episode(problem=p, episode_id=e, group_id=g) for p, e, g in zip(problems, episode_ids, group_ids)]
        # Turn 0: the solver plans.
        plans = act(
            "solver",
            [
                [{"role": "system", "content": SOLVER}, {"role": "user", "content": f"Problem: {e.problem.question}"}]
                for e in eps
            ],
        )
        for e, g in zip(eps, plans):
            e.actions.append(action_row(0, "solver", g))
        # Turn 1: the executor writes code, which runs in the sandbox.
        codes = act(
            "executor",
            [
                [
                    {"role": "system", "content": EXECUTOR},
                    {
                        "role": "user",
                        "content": f"Problem: {e.problem.question}\nPlan: {p.text.strip()}\nWrite the Python program.",
                    },
                ]
                for e, p in zip(eps, plans)
            ],
        )
        sources = [extract_code(g.text) for g in codes]
        with ThreadPoolExecutor(max_workers=4) as pool:
            runs = list(pool.map(lambda c: run_python(c, self.cfg.sandbox) if c else None, sources))
        outputs = []
        for e, g, src, r in zip(eps, codes, sources, runs):
            fb = r.feedback() if r else "NO CODE: the reply had no Python code block"
            outputs.append(fb)
            e.actions.append(
                action_row(
                    1,
                    "executor",
                    g,
                    tool_name="python",
                    tool_input=src or "",
                    tool_output=fb,
                    infra_error=sandbox_fault(r),
                )
            )
            e.metrics["code_error"] = float(r is None or not r.ok)
        # Turn 2: the verifier states the final answer.
        verdicts = act(
            "verifier",
            [
                [
                    {"role": "system", "content": VERIFIER},
                    {"role": "user", "content": f"Problem: {e.problem.question}\nProgram output: {o}"},
                ]
                for e, o in zip(eps, (clip_tokens(act.tokenizer, o, self.cfg.output_tokens, CUT) for o in outputs))
            ],
        )
        for e, g in zip(eps, verdicts):
            e.actions.append(action_row(2, "verifier", g))
            ans = extract_int(g.text)
            e.final_answer = "" if ans is None else str(ans)
            e.success = ans is not None and str(ans) == e.problem.answer
            e.outcome = float(e.success)
            e.metrics["answer_stated"] = float(ans is not None)
            out_num = last_int(e.actions[1]["tool_output"]) if not e.metrics["code_error"] else None
            e.metrics["code_correct"] = float(out_num is not None and str(out_num) == e.problem.answer)
        return eps

    def rubric(self, episode: Episode, ground_truth: bool) -> list[tuple[float | None, str]]:
        return rubric_scores(episode) if ground_truth else blind_rubric_scores(episode)

    def feedback(self, episode: Episode, ground_truth: bool) -> list[str]:
        """Environment feedback per action, as the coach sees it (with the ground truth if `ground_truth`)."""
        code_out = episode.actions[1]["tool_output"]
        truth = f" Correct answer: {episode.problem.answer}." if ground_truth else ""
        return [
            f"The executor's program then printed: {code_out}.{truth}",
            f"Program output: {code_out}.{truth}",
            f"Stated answer: {episode.final_answer or '(none)'}.{truth}",
        ]
