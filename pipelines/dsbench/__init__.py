"""DSBench-style data-science team: Data Engineer -> Modeler -> Analyst on scikit-learn's datasets.

Each episode gets a workspace with train.csv and test.csv (no labels; pipelines/dsbench/data.py). Each
agent writes a Python program that runs in the sandbox inside that workspace, and the files it leaves
are the next agent's input:
  Data Engineer -> features_train.csv, features_test.csv
  Modeler       -> predictions.csv (id, target)
  Analyst       -> submission.csv (id, target), scored against the hidden test labels
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.generation import encode_chat
from infra.retry import InfraFault, infra_record, with_retries
from infra.sandbox import SandboxConfig, preflight, run_python, sandbox_fault
from pipelines.base import (
    Act,
    AgentSpec,
    Episode,
    PipelineBase,
    Problem,
    action_row,
    extract_code,
    no_blind_rubric,
    own_problem,
    own_weights,
)
from pipelines.dsbench import data, synthetic
from pipelines.dsbench.rubric import HANDOFFS, rubric_scores
from pipelines.records import no_docs

FENCE = "```python\n"
Bundled = Literal["diabetes", "breast_cancer", "wine", "iris", "digits"]  # data.DATASETS


# the dataset lists' defaults: functions, as mypy types a lambda's list of names list[str], not list[Bundled]
def _training_datasets() -> list[Bundled]:
    return ["diabetes", "breast_cancer", "wine", "iris"]


def _unused_datasets(cfg: dict[str, Any]) -> list[Bundled]:
    return [d for d in get_args(Bundled) if d not in cfg.get("datasets", [])]


class DSBenchConfig(BaseModel):
    """The data-science team and its task sets."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["dsbench"] = "dsbench"
    datasets: list[Bundled] = Field(
        default_factory=_training_datasets,
        min_length=1,
        description="scikit-learn datasets the tasks are drawn from, round-robin (each task: its own split)",
    )
    train_size: int = Field(64, ge=1, description="training tasks (dataset x split seed)")
    eval_size: int = Field(16, ge=1, description="held-out tasks (split seeds disjoint from training)")
    heldout: Literal["datasets", "splits"] = Field(
        "splits",
        description="where the held-out tasks come from: datasets: datasets training never sees "
        "(heldout_datasets, then heldout_synthetic generated ones, round-robin), a test of generalisation, what the "
        "dsbench presets use; splits: new splits of the training datasets, which measures those few datasets only "
        "(the default, so a run folder whose config predates this field keeps its held-out set)",
    )
    heldout_datasets: list[Bundled] = Field(
        default_factory=_unused_datasets,
        description="with heldout=datasets: bundled datasets of the held-out tasks, none of them in `datasets` "
        "(default: the bundled ones training does not use)",
    )
    heldout_synthetic: int = Field(
        4,
        ge=0,
        description="with heldout=datasets: also this many synthetic datasets (make_classification and "
        "make_regression by turns), their shapes and generator seeds drawn from the run seed "
        "(pipelines/dsbench/synthetic.py)",
    )
    max_new_tokens: dict[str, int] = Field(
        default_factory=lambda: {"data_engineer": 128, "modeler": 160, "analyst": 96},
        description="response token budget per agent",
    )
    examples: bool = Field(
        True,
        description="show each agent a short working program for its step (a "
        "baseline to adapt) in its prompt; off: the role description only",
    )
    scaffold: Literal["none", "fence", "head"] = Field(
        "head",
        description="what each reply starts with (prompt tokens, not trained): none; fence: a ```python "
        "block; head: the block and the example program's opening lines (reading the inputs), so the agent "
        "writes the step itself (HEAD_LINES)",
    )
    stop: list[str] = Field(
        default_factory=lambda: ["```", "\n\n"],
        description="a reply ends where its text first contains one of these (kept in the reply; HumanEval-style "
        "stop sequences): the block's closing fence, or a blank line, so a program is its first block of lines and "
        "cannot run on into the budget. Needs a scaffold (the opening fence in the prompt); [] to turn off",
    )
    sandbox: SandboxConfig = Field(
        default_factory=lambda: SandboxConfig(timeout_s=30, cpu_s=30, memory_mb=2048, site_packages=True),
        description="limits for the agents' programs; site_packages gives them numpy, pandas and scikit-learn "
        "(the sandbox interpreter must have them: `make` installs Debian's python3-sklearn)",
    )

    @model_validator(mode="after")
    def _stop_needs_a_scaffold(self):
        if self.scaffold == "none" and self.stop:
            raise ValueError(
                f"pipeline.stop={self.stop} needs scaffold fence or head: with scaffold none the reply "
                "opens its own ```python block and would stop there; set pipeline.stop=[] too"
            )
        return self

    @model_validator(mode="after")
    def _heldout_unseen(self):
        if seen := [d for d in self.heldout_datasets if d in self.datasets]:
            raise ValueError(
                f"pipeline.heldout_datasets {seen} are also in pipeline.datasets: a held-out dataset must "
                "be one training never sees; remove it from one of the two lists"
            )
        if self.heldout == "datasets" and not (self.heldout_datasets or self.heldout_synthetic):
            raise ValueError(
                "pipeline.heldout=datasets needs a held-out dataset: list some in "
                "pipeline.heldout_datasets, set pipeline.heldout_synthetic > 0, or use heldout=splits"
            )
        return self

    def heldout_names(self) -> Sequence[str]:
        """The datasets of the held-out tasks, round-robin."""
        if self.heldout == "splits":
            return self.datasets
        return self.heldout_datasets + synthetic.names(self.heldout_synthetic)


ROLES = {
    "data_engineer": (
        "You are the Data Engineer. Reply with a short Python program in a ```python block that "
        "reads train.csv and test.csv with pandas and writes features_train.csv (features and "
        "target) and features_test.csv (id and the same features)."
    ),
    "modeler": (
        "You are the Modeler. Reply with a short Python program in a ```python block that reads "
        "features_train.csv and features_test.csv, fits a scikit-learn model for `target` and writes "
        "predictions.csv with columns id,target."
    ),
    "analyst": (
        "You are the Analyst. Reply with a short Python program in a ```python block that reads "
        "predictions.csv, checks it has one row per id of test.csv, and writes submission.csv with "
        "columns id,target."
    ),
}
# a working program per role, shown with `examples`: the team's job is to run it reliably and improve on it
EXAMPLES = {
    "data_engineer": """import pandas as pd
train = pd.read_csv("train.csv")
test = pd.read_csv("test.csv")
cols = [c for c in test.columns if c != "id"]
train[cols + ["target"]].to_csv("features_train.csv", index=False)
test[["id"] + cols].to_csv("features_test.csv", index=False)""",
    "modeler": """import pandas as pd
from sklearn.ensemble import {model}
train = pd.read_csv("features_train.csv")
test = pd.read_csv("features_test.csv")
X = train.drop(columns=["target"])
model = {model}().fit(X, train["target"])
out = pd.DataFrame({{"id": test["id"], "target": model.predict(test[X.columns])}})
out.to_csv("predictions.csv", index=False)""",
    "analyst": """import pandas as pd
pred = pd.read_csv("predictions.csv")
test = pd.read_csv("test.csv")
assert len(pred) == len(test) and set(pred["id"]) == set(test["id"])
pred[["id", "target"]].to_csv("submission.csv", index=False)""",
}
HEAD_LINES = {"data_engineer": 3, "modeler": 5, "analyst": 3}  # lines of EXAMPLES prefilled with scaffold=head
MODEL = {"regression": "RandomForestRegressor", "classification": "RandomForestClassifier"}
IMPORT_RE = re.compile(r"^\s*(import|from)\s+\w+", re.M)


def program(text: str) -> str | None:
    """The code in a reply: a fenced block, or a reply that starts importing modules."""
    return extract_code(text) or (text.strip().strip("`") if IMPORT_RE.search(text) else None)


class DSBench(PipelineBase):
    name = "dsbench"
    Config: type[BaseModel] = DSBenchConfig
    agents = [
        AgentSpec("data_engineer", "Data Engineer: writes feature-engineering code that produces the feature files"),
        AgentSpec("modeler", "Modeler: trains a model on the feature files and writes predictions.csv"),
        AgentSpec("analyst", "Analyst: validates the predictions and writes submission.csv"),
    ]
    weights = own_weights(agents)

    # the coach-bias monitor (flows/train.py) compares coach and metric per task type: metrics["regression"]
    task_types: tuple[str, dict[float, str]] | None = ("regression", {1.0: "regression", 0.0: "classification"})

    def stop(self, agent: str) -> tuple[str, ...]:
        return tuple(self.cfg.stop)

    def __init__(self, cfg: DSBenchConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        preflight(cfg.sandbox)

    def problems(self, split: str) -> list[data.DSProblem]:
        if split == "train":
            return data.make_problems(self.cfg.datasets, self.cfg.train_size, self.seed)
        if split == "eval":
            return data.make_problems(
                self.cfg.heldout_names(), self.cfg.eval_size, self.seed, start=self.cfg.train_size
            )
        raise ValueError(f"unknown split {split!r}: train | eval")

    @staticmethod
    def group_of(problem: Problem) -> str:
        """A problem's dataset, from its task id `<dataset>-<split seed>` (data.py): held-out success is also
        reported per dataset."""
        return problem.task_id.rsplit("-", 1)[0]

    def load_problems(self, path: str, docs: str | None = None) -> list[data.DSProblem]:
        """A user's tasks: a CSV file, its target column and a metric each (pipelines/dsbench/data.py
        `load_tasks`)."""
        no_docs(self.name, docs)
        return data.load_tasks(path, self.seed)

    def run_episodes(
        self, problems: Sequence[Problem], episode_ids: list[str], group_ids: list[str], act: Act
    ) -> list[Episode]:
        eps = [Episode(problem=p, episode_id=e, group_id=g) for p, e, g in zip(problems, episode_ids, group_ids)]
        spaces = [Path(tempfile.mkdtemp(prefix="teamrl-ds-")) for _ in eps]
        try:
            for e, ws in zip(eps, spaces):
                data.write_workspace(_task(e), ws)
            notes = ["" for _ in eps]  # what the previous agent's program printed, and the files it left
            for turn, agent in enumerate(ROLES):
                chats = [
                    [
                        {"role": "system", "content": self._role(agent, _task(e))},
                        {"role": "user", "content": self._brief(e, ws, n)},
                    ]
                    for e, ws, n in zip(eps, spaces, notes)
                ]
                leads = [self._lead(agent, _task(e)) for e in eps]
                gens = act(agent, [self._prompt(act.tokenizer, c, lead) for c, lead in zip(chats, leads)])
                codes = [program(lead + g.text) for g, lead in zip(gens, leads)]
                with ThreadPoolExecutor(max_workers=4) as pool:
                    runs = list(
                        pool.map(
                            lambda c, ws: run_python(c, self.cfg.sandbox, workdir=str(ws)) if c else None, codes, spaces
                        )
                    )
                for i, (e, ws, g, c, r) in enumerate(zip(eps, spaces, gens, codes, runs)):
                    out = r.feedback() if r else "NO CODE: the reply had no Python program"
                    made = all((ws / f).exists() for f in HANDOFFS[agent])
                    notes[i] = f"{agent} program output: {out}\nFiles now: {_files(ws)}"
                    e.actions.append(
                        action_row(
                            turn,
                            agent,
                            g,
                            tool_name="python",
                            tool_input=c or "",
                            tool_output=f"{out}\nFiles now: {_files(ws)}",
                            infra_error=sandbox_fault(r),
                        )
                    )
                    e.metrics[f"{agent}_ok"] = float(bool(r and r.ok) and made)
            for e, ws in zip(eps, spaces):
                self._score(e, ws)
        finally:
            for ws in spaces:
                shutil.rmtree(ws, ignore_errors=True)
        return eps

    def _role(self, agent: str, problem: data.DSProblem) -> str:
        if not self.cfg.examples:
            return ROLES[agent]
        example = EXAMPLES[agent].format(model=MODEL[problem.kind])
        return f"{ROLES[agent]}\nA program that works:\n```python\n{example}\n```"

    def _lead(self, agent: str, problem: data.DSProblem) -> str:
        """The reply's prefilled start (see `scaffold`)."""
        if self.cfg.scaffold == "none":
            return ""
        if self.cfg.scaffold == "fence":
            return FENCE
        head = EXAMPLES[agent].format(model=MODEL[problem.kind]).splitlines()[: HEAD_LINES[agent]]
        return FENCE + "\n".join(head) + "\n"

    @staticmethod
    def _prompt(tokenizer, chat: list[dict], lead: str) -> list:
        """The chat itself, or with the scaffold its tokens followed by the reply's prefilled start."""
        if not lead:
            return chat
        return encode_chat(tokenizer, chat) + tokenizer(lead, add_special_tokens=False)["input_ids"]

    def _brief(self, e: Episode, ws: Path, note: str) -> str:
        head = (ws / "train.csv").read_text().splitlines()[0]
        return f"Task: {e.problem.question}\ntrain.csv columns: {head[:300]}\n{note}".strip()

    def _score(self, e: Episode, ws: Path) -> None:
        p = _task(e)
        try:
            s = with_retries(lambda: data.score_submission(p, ws), "scorer", f"scoring {p.task_id}")
        except InfraFault as fault:  # the episode stays unscored: its outcome is unknown, not zero
            e.infra_error = infra_record(fault.kind, fault.message)
            e.final_answer = "(not scored: the scorer failed)"
            return
        e.metrics |= s.metrics | {
            "submission_ok": float(s.ok),
            "regression": float(p.kind == "regression"),
            "code_error": float(not all(e.metrics[f"{a}_ok"] for a in ROLES)),
        }
        e.success = bool(s.metrics.get("success", 0.0))
        e.outcome = data.outcome(p, s)
        e.final_answer = s.feedback[:500]

    def rubric(self, episode: Episode, ground_truth: bool) -> list[tuple[float | None, str]]:
        if not ground_truth:  # its scores grow with the outcome, measured on the hidden test labels
            raise ValueError(no_blind_rubric(self.name))
        return rubric_scores(episode)

    def feedback(self, episode: Episode, ground_truth: bool) -> list[str]:
        """Environment feedback per action, as the LLM coach sees it: the program's output and the files it
        left, and with `ground_truth` the submission's score (measured on the hidden test labels)."""
        final = f"\nFinal result: {episode.final_answer}" if ground_truth else ""
        return [f"{a['tool_output']}{final}" for a in episode.actions]


def _task(e: Episode) -> data.DSProblem:
    return own_problem(e.problem, data.DSProblem)


def _files(ws: Path) -> str:
    return ", ".join(sorted(p.name for p in ws.iterdir() if not p.name.startswith("."))) or "(none)"
