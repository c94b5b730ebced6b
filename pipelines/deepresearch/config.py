"""The deep-research pipeline's settings, the `pipeline:` section of a deepresearch config: the corpus
(generated, or the user's files), the MARS team, the turn budget, the scaffold and examples of the prompts,
the reward and the python tool's sandbox, validated on load. It is a declarative schema whose field
descriptions are the config reference (flows/reference.py), kept apart so the pipeline module (__init__.py)
holds only how episodes are played.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from infra.sandbox import SandboxConfig
from pipelines.dual_system import DualSystemConfig

AnswerKind = Literal["name", "year"]  # what a question asks for (corpus.answer_kind)


class DeepResearchConfig(DualSystemConfig):
    """The MARS research team, its corpus and its turn budget (and the dual-system knobs: bin_tokens, balance,
    system1_credit)."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["deepresearch"] = "deepresearch"
    questions: int = Field(300, ge=2, description="generated questions (train + held-out)")
    eval_size: int = Field(50, ge=1, description="held-out questions (the last ones of the question set)")
    distractors: int = Field(200, ge=0, description="generated documents that no question needs")
    train_answers: list[AnswerKind] = Field(
        default_factory=lambda: list(get_args(AnswerKind)),
        min_length=1,
        description="what the training questions ask for (a year: four digits; a name: any other answer); "
        "the held-out questions keep every kind. [name] is a curriculum: no reward for answering a year",
    )
    hops: list[int] = Field(
        default_factory=lambda: [1, 2, 3, 4],
        min_length=1,
        description="chain lengths of the generated questions, mixed evenly (1..4)",
    )
    min_tokens: int = Field(50, ge=10, description="shortest generated document (approximate tokens)")
    max_tokens: int = Field(2000, ge=10, description="longest generated document (approximate tokens)")
    docs_file: str | None = Field(None, description="your corpus: JSONL {id, title?, text} (with questions_file)")
    questions_file: str | None = Field(None, description="your questions: JSONL {question, answer, hops?, support?}")
    system1: bool = Field(
        True,
        description="false: the ablation without System 1 (System 2 reads the raw tool "
        "output, truncated to context_tokens)",
    )
    shared_model: bool = Field(
        True,
        description="true (the paper's MARS): one set of trainable weights, `shared`, "
        "plays System 2 and System 1, each with its own prompt, updated once per iteration "
        "on both systems' samples; false: one set per system (a deviation from the paper)",
    )
    max_turns: int = Field(3, ge=1, le=16, description="System-2 turns per episode; the last one must answer")
    scaffold: bool = Field(
        True,
        description="System 2's first reply starts with `SEARCH:` and its last with "
        "`ANSWER:` already written (it writes the rest): a small zero-RL model rarely finds the "
        "format alone",
    )
    top_k: int = Field(3, ge=1, description="documents per search")
    context_tokens: int = Field(
        256,
        ge=16,
        description="System 2's budget per observation: the joined "
        "extractions, or the raw tool output without System 1, truncated to this",
    )
    reward: Literal["f1", "em"] = Field("f1", description="trajectory reward: token F1 or exact match")
    max_new_tokens: dict[str, int] = Field(
        default_factory=lambda: {"system2": 48, "system1": 64}, description="response token budget per agent"
    )
    examples: bool = Field(
        True,
        description="show each system worked examples as earlier chat turns (System 2: "
        "a whole episode, search, findings, answer; System 1: a document and the fact sentence "
        "copied out of it), about fictional entities outside the corpus; false: the instructions "
        "only",
    )
    two_search_example: bool = Field(
        False,
        description="with `examples`, also show System 2 a 2-hop episode that searches twice (the "
        "first findings name whom the second search asks about); needs max_turns >= 3",
    )
    stop: list[str] = Field(
        default_factory=lambda: ["\n"],
        description="a reply ends where its text first contains one of these (kept in the "
        "reply): a newline, so every reply is one line (a System-2 command, or the one sentence "
        "System 1 copies) and cannot run on into its budget; [] to turn off",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits for the python tool")

    @model_validator(mode="after")
    def _check(self):
        if (self.docs_file is None) != (self.questions_file is None):
            raise ValueError("docs_file and questions_file go together: give both or neither")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} > max_tokens {self.max_tokens}")
        if self.two_search_example and not self.examples:
            raise ValueError("two_search_example is one of the worked examples: it needs examples=true")
        if self.two_search_example and self.max_turns < 3:
            raise ValueError(
                f"two_search_example shows two searches and an answer: needs max_turns >= 3, got {self.max_turns}"
            )
        if bad := [h for h in self.hops if not 1 <= h <= 4]:
            raise ValueError(f"hops must be within 1..4, got {bad}")
        return self
