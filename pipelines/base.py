"""What every pipeline provides to the DAG: its agents, its problems, an episode runner, a rubric."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd
from pydantic import BaseModel

from infra.generation import Generation
from infra.trainer import TrainItem


@dataclass(frozen=True)
class AgentSpec:
    name: str  # agent id, also the adapter / checkpoint name
    role: str  # what the agent is for, as the coach is told
    system: int = 0  # the `actions.system` column: 0 = single-system agent; 1 / 2 = a dual-system team's


@dataclass(frozen=True)
class Problem:
    task_id: str
    question: str
    answer: str


P = TypeVar("P", bound=Problem)


def own_problem(problem: Problem, cls: type[P]) -> P:
    """`problem` as `cls`, the pipeline's own Problem subclass, whose fields its episodes read
    (Pipeline.run_episodes is handed the base type)."""
    if not isinstance(problem, cls):
        raise TypeError(
            f"problem {problem.task_id!r} is a {type(problem).__name__}; the pipeline runs {cls.__name__} "
            "problems (from its problems() or load_problems())"
        )
    return problem


@dataclass
class Episode:
    """One finished episode: the `episodes` row fields and its actions (without run keys)."""

    problem: Problem
    episode_id: str
    group_id: str
    actions: list[dict] = field(default_factory=list)
    final_answer: str = ""
    success: bool = False
    outcome: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    infra_error: str | None = None  # an infrastructure fault outside any action (a scorer): infra.retry.infra_record


@dataclass(frozen=True)
class ToolCall:
    """One tool call's raw output (a dual-system team's System 1 extracts from it: pipelines/dual_system)."""

    purpose: str  # why System 2 called the tool: what System 1 should look for
    documents: list[str]  # the raw outputs (search hits, program output), each packed as one item
    infra_error: str | None = None  # the tool backend failed (infra.retry.infra_record); documents say so


@dataclass
class Extraction:
    """System 1's work on one tool call: its packed bins and one generation per bin."""

    bins: list[str]  # the packed input text of each bin
    generations: list[Generation]  # System 1's extraction per bin
    tokens_in: int  # raw document tokens packed
    lower_bound: int  # ceil(tokens_in / bin capacity): no packing uses fewer bins


class Act(Protocol):
    """The team as the pipeline's episodes see it (built per partition by tasks/collect_rollouts.py)."""

    tokenizer: Any

    def __call__(self, agent: str, prompts: list) -> list[Generation]:
        """One batched generation: one Generation per prompt, a chat (list of {"role", "content"}) or
        token ids (a context built with infra.generation.continue_chat)."""

    def stage(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` as the DAG stage `name` (its own Prefect task run in a flow; a plain call in a Ray
        rollout actor): a pipeline's own step inside an episode, such as MARS's System-1 `extract`."""


@dataclass(frozen=True)
class RunFacts:
    """What a pipeline may check about the rest of a run's config (Pipeline.check_config)."""

    coach_backend: str  # coach.backend
    estimator: str  # algorithm.estimator
    trajectory: bool  # the estimator gives every action its trajectory's advantage (one reward per episode)


@dataclass
class CreditBatch:
    """One estimator call's actions and their advantages, for a pipeline's `credit` hook to change in place."""

    actions: list[dict]  # the `actions` rows, with `system` and `score`
    samples: list  # one tasks.advantages.Sample (a dataclass) per action, with the reward it was estimated from
    advs: list  # per-token advantages per action (None: none), scaled as the loss uses them
    raws: list  # the same in reward units (`raw_advantages`)
    trajectory: bool  # the estimator gave every action its trajectory's advantage
    estimate: Callable[..., list]  # tasks.advantages.estimate(name, samples, scale=True) with the run's eps


class Pipeline(Protocol):
    # mypy matches a protocol's attributes exactly (they are settable): a pipeline that sets one to a value
    # of a narrower type annotates it with the type here, as in `Config: type[BaseModel] = MathChatConfig`
    name: str
    Config: type[BaseModel]  # its config model (with `name`), built as `Pipeline(Config(...), seed)`
    agents: list[AgentSpec]
    # role (agent name) -> the trainable weights that play it (a LoRA adapter or a full copy; its checkpoints,
    # its updates, its version): `own_weights` for a team of separate models, one name for roles sharing one
    weights: dict[str, str]
    answer_blind_rubric: bool  # rubric(..., ground_truth=False) exists (coach.ground_truth=false, backend rubric)

    def __init__(self, cfg: Any, seed: int) -> None: ...

    # Sequence, not list: a pipeline's lists hold its own Problem subclass (a list's type is invariant)
    def problems(self, split: str) -> Sequence[Problem]: ...

    def load_problems(self, path: str, docs: str | None = None) -> Sequence[Problem]:
        """A user's problem file (`teamrl eval --problems`; `docs`: its documents file, where the pipeline's
        questions are asked over documents), validated before any model loads: a ValueError names the file
        and line of the first bad record."""

    def run_episodes(
        self, problems: Sequence[Problem], episode_ids: list[str], group_ids: list[str], act: Act
    ) -> list[Episode]: ...

    def rubric(self, episode: Episode, ground_truth: bool) -> Sequence[tuple[float | None, str]]:
        """A score 0..10 and a rationale per action; None = not scored (stored as `skipped`, no gradient).
        Without `ground_truth` the scores must not depend on the problem's answer."""

    def feedback(self, episode: Episode, ground_truth: bool) -> list[str]:
        """Environment feedback per action for the `llm` coach; without `ground_truth` no text of it may
        contain the answer or anything derived from it (a score against hidden labels, gold documents)."""

    @staticmethod
    def group_of(problem: Problem) -> str | None:
        """The group of a problem, e.g. DSBench's dataset (None: the pipeline does not group its problems);
        held-out success is also reported per group. Static: reports call it on the class, with problems
        rebuilt from stored episodes."""

    # (metric key, {metric value: task type}): turns on the coach-bias monitor per task type, or None
    task_types: tuple[str, dict[float, str]] | None

    def stop(self, agent: str) -> tuple[str, ...]:
        """Strings that end `agent`'s reply (besides end-of-sequence)."""

    # the range of Episode.outcome; with the coach's 0..10 scale it bounds every reward (TeamTR's certificate)
    outcome_range: tuple[float, float]

    def max_actions(self) -> int:
        """The most actions one episode can have, from the config alone: with `outcome_range` it bounds the
        task return, so the certificate's span is known before any update (tasks/certificate.py)."""

    # hooks of the training batch (PipelineBase: the single-system defaults; pipelines/dual_system: MARS's)
    def credit(self, batch: CreditBatch) -> None:
        """Change one estimator batch's advantages in place, after the estimator and before
        algorithm.positive_only (compute_advantages)."""

    def weigh(self, rows: list[dict], actions: list[dict], rng: np.random.Generator) -> None:
        """Set, in place, how many times each `advantages` row of a partition enters its update (`weight`;
        `actions[i]` is row i's action), drawing with `rng` (compute_advantages)."""

    def train_items(self, rows: pd.DataFrame, reference: bool) -> list[TrainItem]:
        """One weights unit's update batch from its roles' `advantages`-joined action rows; `reference`: the
        items carry the rows' reference log-probs (update)."""

    @staticmethod
    def episode_metrics(em: pd.DataFrame) -> dict[str, float]:
        """Metrics of a partition from its episodes' `metrics` (one row per episode), beyond the mean of each
        (`episode/<key>`, which every pipeline gets). Static, as `group_of` (flows/metrics.py)."""

    @classmethod
    def check_config(cls, cfg: Any, run: RunFacts) -> None:
        """Refuse, with a ValueError naming the fields, a pipeline config `cfg` that does not fit the rest of
        the run's config (checked when a config is loaded)."""


class PipelineBase:
    """What a pipeline may leave out of the `Pipeline` protocol: the defaults of its optional hooks. Every
    pipeline subclasses it, so a generic stage calls a hook without asking whether the pipeline has it."""

    agents: list[AgentSpec]
    answer_blind_rubric = False
    task_types: tuple[str, dict[float, str]] | None = None
    outcome_range: tuple[float, float] = (0.0, 1.0)

    @staticmethod
    def group_of(problem: Problem) -> str | None:
        return None

    def stop(self, agent: str) -> tuple[str, ...]:
        return ()

    def max_actions(self) -> int:
        """One action per agent."""
        return len(self.agents)

    def credit(self, batch: CreditBatch) -> None:
        """The estimator's advantages as they are."""

    def weigh(self, rows: list[dict], actions: list[dict], rng: np.random.Generator) -> None:
        """Every row with an advantage once (the weight compute_advantages gave it)."""

    def train_items(self, rows: pd.DataFrame, reference: bool) -> list[TrainItem]:
        return row_items(rows, reference)

    @staticmethod
    def episode_metrics(em: pd.DataFrame) -> dict[str, float]:
        return {}

    @classmethod
    def check_config(cls, cfg: Any, run: RunFacts) -> None:
        """Every config fits."""


def row_items(df: pd.DataFrame, reference: bool = False) -> list[TrainItem]:
    """Each action row as its own sample, `weight` times (0: left out). `reference`: with the row's reference
    log-probs, for a loss with a KL term to the reference."""
    return [
        TrainItem(
            list(r["prompt_ids"]),
            list(r["response_ids"]),
            list(r["logprobs"]),
            list(r["advantages"]),
            list(r["loss_mask"]),
            ref_of(r, reference),
        )
        for r in df[df["weight"].fillna(0) > 0].to_dict("records")
        for _ in range(int(r["weight"]))
    ]


def ref_of(row: dict, wanted: bool) -> list[float] | None:
    """An action row's reference log-probs where `wanted` (None where the rollout ran no reference pass)."""
    ref = row.get("ref_logprobs") if wanted else None
    return None if ref is None else [float(x) for x in ref]


def clip_tokens(tokenizer, text: str, budget: int, marker: str = "") -> str:
    """`text` cut to its first `budget` tokens (with `marker` after a cut): what one agent's output may add to
    another's prompt, since a long one would make that prompt, and its training step, grow without bound."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= budget else tokenizer.decode(ids[:budget]) + marker


def own_weights(agents: list[AgentSpec]) -> dict[str, str]:
    """The `weights` of a team whose every agent has its own weights: each role maps to itself."""
    return {a.name: a.name for a in agents}


def weight_units(weights: dict[str, str]) -> list[str]:
    """The distinct weights of a team, in role order: what is built, updated, checkpointed and versioned."""
    return list(dict.fromkeys(weights.values()))


def role_versions(weights: dict[str, str], versions: dict[str, int]) -> dict[str, int]:
    """Each role's policy version from its weights' `versions` (keyed by weights unit)."""
    return {role: versions[w] for role, w in weights.items()}


def no_blind_rubric(pipeline: str) -> str:
    """Why coach.ground_truth=false cannot run with coach.backend=rubric on `pipeline`."""
    return (
        f"coach.ground_truth=false with coach.backend=rubric: the {pipeline} pipeline has no answer-blind rubric "
        "(its rubric scores against the answer); use coach.backend=llm, which is answer-blind for every "
        "pipeline, or coach.ground_truth=true"
    )


def action_row(
    turn: int,
    agent: str,
    g: Generation,
    system: int = 0,
    prompt_ids: list[int] | None = None,
    tool_name: str | None = None,
    tool_input: str | None = None,
    tool_output: str | None = None,
    parent_turn: int | None = None,
    infra_error: str | None = None,
) -> dict:
    """One `actions` row of an episode (without the run keys): a generation and the tool call it made.
    `prompt_ids` defaults to the generation's prompt (a MARS System-2 turn passes its token context);
    `infra_error`: the tool could not run (infra.retry.infra_record), so the episode is not scored."""
    return {
        "turn": turn,
        "agent": agent,
        "role": agent,
        "system": system,
        "prompt_ids": list(g.prompt_ids if prompt_ids is None else prompt_ids),
        "response_ids": g.response_ids,
        "logprobs": g.logprobs,
        "response_text": g.text,
        "tool_name": tool_name,
        "tool_input": tool_input,
        "tool_output": tool_output,
        "parent_turn": parent_turn,
        "infra_error": infra_error,
    }


CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def extract_code(text: str) -> str | None:
    """The first fenced code block; else the whole reply if it looks like Python; else None."""
    m = CODE_RE.search(text)
    if m and m.group(1).strip():
        return m.group(1).strip()
    if "print(" in text:
        return text.strip().strip("`")
    return None
