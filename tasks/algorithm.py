"""The training algorithm's configuration: advantage estimator, KL shaping, PPO clip, optimiser."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class AlgorithmConfig(BaseModel):
    """REINFORCE++ by default (MAPPA); `grpo` and `rloo` are selectable estimators."""

    model_config = ConfigDict(extra="forbid")

    estimator: str = Field(
        "reinforce_pp",
        description="advantage estimator from the registry: "
        "reinforce_pp | grpo | rloo | grpo_trajectory (MARS: one reward per trajectory)",
    )
    strategy: Literal["joint", "stale", "teamtr"] = Field(
        "joint",
        description="how agents are updated within an iteration: `joint` = every agent from the one rollout "
        "set; `stale` = one by one on that cached set; `teamtr` = one by one, each on fresh rollouts (`resample-<i>`) "
        "collected with the agents before it already updated",
    )
    order: Literal["fixed", "random"] = Field(
        "fixed", description="update order per iteration: the team's order, or a seeded random permutation"
    )
    kl_delta: float | None = Field(
        None,
        gt=0,
        description="trust region: token-level KL(pi_cur || pi_new) per "
        "update, estimated on the update's batch; early-stops the epochs and backtracks "
        "the step above it, and logs KL, gain, penalty and certificate (None: off)",
    )
    certify_holdout: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="stale / teamtr: the share of each batch's question groups held out of the update (at "
        "least two, never all) to estimate its certificate on episodes it never fitted (tasks/certificate.py); "
        "those groups train nobody, the cost of a certificate that holds at its stated 95%. 0: no held-out "
        "groups and no certificate",
    )
    backtrack_steps: int = Field(
        6, ge=0, le=20, description="halvings of the step tried before an update that still exceeds kl_delta is skipped"
    )
    resample_questions: int | None = Field(
        None,
        ge=1,
        description="teamtr: questions per resample (None: "
        "rollout.questions); fewer questions cost fewer extra rollouts",
    )
    kl_coef: float = Field(
        0.01,
        ge=0,
        description="beta: weight of the per-token KL penalty in the reward (reinforce_pp; the group estimators "
        "grpo, rloo and grpo_trajectory have no KL term and need 0)",
    )
    kl_loss_coef: float = Field(
        0.0,
        ge=0,
        description="beta of a KL term in the loss instead of the reward (GRPO as in DeepSeekMath): + beta * "
        "token-mean of exp(ref - logp) - (ref - logp) - 1, the k3 estimate of KL(pi || pi_ref) against the "
        "reference (the base model: adapters off); runs the reference pass; 0: none",
    )
    positive_only: bool = Field(
        False,
        description="train only on actions that did better than their baseline: negative advantages become 0 "
        "(A' = max(A, 0), after the pipeline's credit hook and before its weighing), so an update raises what "
        "succeeded and pushes nothing down; a deviation from GRPO and REINFORCE++, whose failures' push-down can "
        "move probability to whatever is already likely; `raw_advantages` keeps the estimator's values",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="per-token KL estimator against the reference")
    return_scope: Literal["action", "agent"] = Field(
        "action",
        description="`action`: return-to-go stops at the end "
        "of each action; `agent`: continues across the agent's later actions",
    )
    outcome_weight: float = Field(0.0, ge=0, le=1, description="w in s = (1-w)*coach/10 + w*outcome")
    loss: str = Field("ppo_clip", description="policy loss from the registry (tasks/losses.py LOSSES): ppo_clip")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip epsilon")
    whiten_eps: float = Field(1e-6, gt=0, description="epsilon added to the std when normalising advantages")
    whiten_min_std: float = Field(
        0.0,
        ge=0,
        description="reinforce_pp: a batch whose returns' std (reward units) is below this is only centred, "
        "not divided by its std; with equal scores the returns differ only by the KL shaping, which "
        "whitening would blow up to unit advantages (0: always divide, as OpenRLHF and verl do)",
    )
    lr: float = Field(2e-4, gt=0, le=1, description="AdamW learning rate of each agent's trainable weights")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    epochs: int = Field(1, ge=1, le=100, description="passes over the agent's batch per update")
    minibatch_size: int = Field(8, ge=1, description="actions per gradient step")
    micro_batch_size: int = Field(
        2,
        ge=1,
        description="actions per forward/backward pass (gradients are "
        "accumulated over the minibatch; bounds activation memory)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    max_sample_tokens: int | None = Field(
        4096,
        ge=16,
        description="the longest training sample an update takes (prompt + response tokens; a MARS System-2 "
        "trajectory joined): a longer one is left out of the update and counted in `updates.over_length`, "
        "since one runaway context (a program printing thousands of digits) can make a training step that "
        "exhausts the trainer's memory (None: no bound)",
    )

    measure_update: bool = Field(
        True,
        description="after each update, score the unit's actions again at the new weights to record the "
        "update's KL and surrogate gain (`updates.kl`, `updates.surrogate_gain`) and, for stale / teamtr, "
        "its certificate: one more forward pass over every action of the unit; false skips it (joint only: "
        "the certificate needs it)",
    )

    @model_validator(mode="after")
    def _certificates_need_the_measurement(self):
        if not self.measure_update and self.strategy != "joint":
            raise ValueError(
                f"algorithm.measure_update=false with strategy={self.strategy}: the certificate of stale and "
                "teamtr updates is computed from that measurement; keep it on, or use strategy=joint"
            )
        return self

    @model_validator(mode="after")
    def _teamtr_without_a_trust_region_is_an_ablation(self):
        if self.strategy == "teamtr" and self.kl_delta is None:
            warnings.warn(
                "algorithm.strategy=teamtr with kl_delta=null: an ablation without TeamTR's trust region "
                "(resampling only); set algorithm.kl_delta (e.g. 0.05) for TeamTR",
                UserWarning,
                stacklevel=2,
            )
        return self

    @model_validator(mode="after")
    def _kl_coef_needs_a_kl_term(self):
        from tasks.advantages import ESTIMATORS

        if self.kl_coef > 0 and not ESTIMATORS.traits(self.estimator).uses_kl:
            raise ValueError(
                f"algorithm.kl_coef={self.kl_coef:g} does nothing with estimator {self.estimator}, which has no "
                "KL term in the reward (reinforce_pp has one; an estimator declares one with `uses_kl=True` where "
                "it is registered): set algorithm.kl_coef=0, and algorithm.kl_loss_coef for a KL term in the loss"
            )
        return self

    @field_validator("estimator", "loss")
    @classmethod
    def _registered(cls, v: str, info: ValidationInfo) -> str:
        from tasks.advantages import ESTIMATORS
        from tasks.losses import LOSSES

        registries: dict[str, Mapping[str, object]] = {"estimator": ESTIMATORS, "loss": LOSSES}
        registry = registries[str(info.field_name)]
        if v not in registry:
            raise ValueError(f"unknown {info.field_name} {v!r}; choose one of {sorted(registry)}")
        return v
