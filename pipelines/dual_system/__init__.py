"""Dual-system teams (MARS): System 2 reasons and calls tools, System 1 reads the tools' bin-packed output and
extracts what serves each call's purpose; one model may play both. A pipeline with such a team subclasses
`DualSystem` (a PipelineBase) and builds its config on `DualSystemConfig`; the generic stages reach MARS only
through the Pipeline protocol's hooks, implemented here:

| hook | MARS | where |
|---|---|---|
| `extract` (run_episodes calls it) | FFD packing, one System-1 generation per turn, as stage `extract` | extract.py |
| `credit` | `system1_credit=coach`: System 1 credited by its own coach scores | here |
| `weigh` | balanced sampling: System 1 resampled to System 2's count | balanced_sampling.py |
| `train_items` | decoupled gradients: System 2's turns joined, observations masked | decoupled.py |
| `episode_metrics` | `system1/compression`, `system1/bins_over_lower_bound` | here |
| `check_config` | `system1_credit=coach` needs a coach and a trajectory estimator | here |

A pipeline's agents say which system they are (`AgentSpec.system`, the `actions.system` column: 2 or 1);
its episodes record `s1_tokens_in`, `s1_tokens_out`, `s1_bins` and `s1_bins_lower_bound` per episode.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from infra.trainer import TrainItem
from pipelines.base import Act, CreditBatch, Extraction, PipelineBase, RunFacts, ToolCall
from pipelines.dual_system import decoupled
from pipelines.dual_system.balanced_sampling import balance_system1
from pipelines.dual_system.extract import extract


class DualSystemConfig(BaseModel):
    """The knobs every dual-system team has, in its pipeline's config section."""

    bin_tokens: int = Field(384, ge=16, description="System 1's context budget: document tokens per packed bin")
    balance: Literal["advantage", "uniform", "off"] = Field(
        "advantage",
        description="MARS balanced sampling: System-1 samples are down- / up-sampled to System 2's "
        "count, drawn with p ~ |A| (`advantage`) or uniformly; `off` keeps each once",
    )
    system1_credit: Literal["trajectory", "coach"] = Field(
        "trajectory",
        description="with a trajectory estimator, what a System-1 sample's advantage is: `trajectory` (the "
        "paper's MARS) its trajectory's; `coach` GRPO over its own coach score within its question's "
        "group (per-action credit for the extraction, a deviation from the paper; needs coach.backend "
        "rubric or llm)",
    )


class DualSystem(PipelineBase):
    """The MARS hooks of a pipeline whose config is a DualSystemConfig; it writes `system1_chat`."""

    cfg: Any  # a DualSystemConfig

    def system1_chat(self, purpose: str, text: str) -> list[dict]:
        """System 1's prompt for one packed bin."""
        raise NotImplementedError(f"{type(self).__name__} must write System 1's prompt (system1_chat)")

    def extract(self, act: Act, calls: list[ToolCall]) -> list[Extraction]:
        """System 1 over every call's packed output, as the DAG stage `extract`."""
        return act.stage("extract", extract, self, act, calls, self.cfg.bin_tokens)

    def credit(self, batch: CreditBatch) -> None:
        if batch.trajectory and self.cfg.system1_credit == "coach":
            system1_coach_credit(batch)

    def weigh(self, rows: list[dict], actions: list[dict], rng: np.random.Generator) -> None:
        balance_system1(rows, [int(a["system"]) for a in actions], self.cfg.balance, rng)

    def train_items(self, rows: pd.DataFrame, reference: bool) -> list[TrainItem]:
        return decoupled.train_items(rows, reference)

    @staticmethod
    def episode_metrics(em: pd.DataFrame) -> dict[str, float]:
        """Raw tokens in / extracted out, and FFD's bins over ceil(sum of lengths / capacity)."""
        m = {}
        if em.get("s1_tokens_out", pd.Series(dtype=float)).sum() > 0:
            m["system1/compression"] = float(em["s1_tokens_in"].sum() / em["s1_tokens_out"].sum())
        if em.get("s1_bins_lower_bound", pd.Series(dtype=float)).sum() > 0:
            m["system1/bins_over_lower_bound"] = float(em["s1_bins"].sum() / em["s1_bins_lower_bound"].sum())
        return m

    @classmethod
    def check_config(cls, cfg: Any, run: RunFacts) -> None:
        if cfg.system1_credit == "coach" and (run.coach_backend == "outcome" or not run.trajectory):
            raise ValueError(
                "pipeline.system1_credit=coach gives System 1 its coach scores under a trajectory estimator: it "
                f"needs coach.backend rubric or llm (got {run.coach_backend}) and a trajectory estimator (got "
                f"{run.estimator}, which credits every action by its coach score already)"
            )


def system1_coach_credit(batch: CreditBatch) -> None:
    """Replace System-1 samples' trajectory advantages, in place, by GRPO over their own coach scores
    (s = coach / 10) within their question's group; an unscored extraction gets none."""
    idx = [i for i, a in enumerate(batch.actions) if int(a["system"]) == 1]
    own = [replace(batch.samples[i], score=_coach_score(batch.actions[i]["score"])) for i in idx]
    scaled, raw = batch.estimate("grpo", own), batch.estimate("grpo", own, scale=False)
    for k, i in enumerate(idx):
        batch.samples[i], batch.advs[i], batch.raws[i] = own[k], scaled[k], raw[k]


def _coach_score(score) -> float | None:
    """A coach score 0..10 as a reward in [0, 1]; None where the coach gave none."""
    return None if score is None or not np.isfinite(score) else float(score) / 10.0
