"""MARS with one model for both systems (pipeline.shared_model): the role -> weights map, the shared
update batch (System 2's joined trajectories plus System 1's balanced samples), its gradient, and the
train flow with the shared model and with two models."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.base import own_weights, role_versions, weight_units
from pipelines.dual_system.balanced_sampling import balance_system1
from pipelines.dual_system.decoupled import train_items

ROLES = {"system2": "shared", "system1": "shared"}


def _episode(ep: str, adv: float, s1_advs: list[float]) -> list[dict]:
    """One episode's advantage-joined action rows: two System-2 turns (the second's prompt extends the
    first's prompt + response by an observation [9, 9]) and one System-1 row per bin."""

    def row(turn, agent, system, prompt, response, a):
        n = len(response)
        return {
            "episode_id": ep,
            "turn": turn,
            "agent": agent,
            "system": system,
            "prompt_ids": prompt,
            "response_ids": response,
            "logprobs": [-1.0] * n,
            "advantages": [a] * n,
            "loss_mask": [1] * n,
            "weight": 1,
        }

    rows = [row(0, "system2", 2, [1, 2], [3, 4], adv), row(1, "system2", 2, [1, 2, 3, 4, 9, 9], [5], adv)]
    return rows + [row(2 + i, "system1", 1, [7, i], [8, 8, 8], a) for i, a in enumerate(s1_advs)]


def _balanced(rng=None) -> list[dict]:
    """Three episodes, five System-1 bins, balanced to System 2's three trajectories with p ~ |A|."""
    rows = _episode("a", 1.0, [0.5, 2.0]) + _episode("b", -1.0, [1.0, 0.0]) + _episode("c", 0.5, [3.0])
    balance_system1(rows, [r["system"] for r in rows], "advantage", rng or np.random.default_rng(0))
    return rows


def test_weights_maps():
    from pipelines import build_pipeline, pipeline_config

    assert own_weights(build_pipeline(pipeline_config({"name": "mathchat"}), 0).agents) == {
        "solver": "solver",
        "executor": "executor",
        "verifier": "verifier",
    }
    shared = build_pipeline(pipeline_config({"name": "deepresearch"}), 0)
    assert shared.weights == ROLES and weight_units(shared.weights) == ["shared"]
    two = build_pipeline(pipeline_config({"name": "deepresearch", "shared_model": False}), 0)
    assert two.weights == {"system2": "system2", "system1": "system1"}
    assert role_versions(ROLES, {"shared": 3}) == {"system2": 3, "system1": 3}


def test_shared_batch_is_joined_system2_plus_duplicated_system1():
    rows = _balanced()
    items = train_items(pd.DataFrame(rows))
    s1_weights = [r["weight"] for r in rows if r["system"] == 1]
    # (c) System 1's samples number exactly System 2's: one trajectory sample per episode
    assert sum(s1_weights) == 3 and len(items) == 6
    # (a) one joined System-2 item per episode, in episode order, then each System-1 row `weight` times
    assert [it.prompt_ids for it in items[:3]] == [[1, 2]] * 3
    assert [it.advantages[0] for it in items[:3]] == [1.0, -1.0, 0.5]
    s1 = [r for r in rows if r["system"] == 1]
    want = [(r["prompt_ids"], r["advantages"]) for r in s1 for _ in range(r["weight"])]
    assert [(it.prompt_ids, it.advantages) for it in items[3:]] == want
    # (b) the observation between System 2's turns carries no loss and no advantage
    joined = items[0]
    assert joined.response_ids == [3, 4, 9, 9, 5]
    assert joined.mask == [1, 1, 0, 0, 1] and joined.advantages == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert joined.old_logprobs == [-1.0, -1.0, 0.0, 0.0, -1.0]


def test_separate_weights_batches_are_unchanged():
    """Two models: System 2's batch is its joined trajectories, System 1's its duplicated samples."""
    df = pd.DataFrame(_balanced())
    s2, s1 = train_items(df[df["agent"] == "system2"]), train_items(df[df["agent"] == "system1"])
    both = train_items(df)
    assert len(s2) == 3 and len(s1) == 3
    assert [(it.prompt_ids, it.response_ids, it.mask) for it in both] == [
        (it.prompt_ids, it.response_ids, it.mask) for it in s2 + s1
    ]


@pytest.fixture(scope="module")
def shared_policy():
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    return TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8), ["shared"], seed=0, roles=ROLES)


def test_one_adapter_plays_both_roles(shared_policy, tmp_path):
    pol = shared_policy
    assert pol.unit("system1") == pol.unit("system2") == pol.unit("shared") == "shared"
    assert list(pol.model.peft_config) == ["shared"]
    assert pol.parameters("system1") is pol.parameters("system2")
    with pytest.raises(KeyError, match="unknown agent"):
        pol.unit("system3")
    assert pol.save(tmp_path, "system1", 1) == tmp_path / "checkpoints" / "shared" / "v0001"
    with pytest.raises(ValueError, match="outside the team"):
        type(pol)(pol.cfg, ["a"], roles={"x": "b"})


def _grads(policy, items) -> float:
    """The gradient norm of the shared weights under the trainer's loss on `items`."""
    from functools import partial

    import torch

    from infra.generation import response_logprobs
    from infra.trainer import accumulate
    from tasks.losses import ppo_clip_loss

    params = policy.parameters("shared")
    for p in params:
        p.grad = None
    pad = policy.tokenizer.pad_token_id
    with policy.acting("shared") as model:
        accumulate(
            items,
            2,
            lambda micro, last: response_logprobs(
                model, [it.prompt_ids for it in micro], [it.response_ids for it in micro], pad, 1.0
            ),
            partial(ppo_clip_loss, clip_eps=0.2),
            torch.Tensor.backward,
        )
    return float(sum((p.grad.norm() ** 2 if p.grad is not None else 0.0) for p in params) ** 0.5)


def test_shared_gradient_comes_from_both_systems(shared_policy):
    """(a) Zeroing one system's advantages leaves a gradient from the other; zeroing both leaves none."""
    rows = _balanced()

    def grad_with(*live: int) -> float:
        df = pd.DataFrame(
            [r | {"advantages": [0.0] * len(r["advantages"])} if r["system"] not in live else r for r in rows]
        )
        return _grads(shared_policy, train_items(df))

    assert grad_with(2) > 0 and grad_with(1) > 0
    assert grad_with() == 0.0


@pytest.mark.slow
def test_shared_model_flow(mars_run):
    """(d, e) deepresearch-tiny (shared_model: true), one iteration: one update of `shared`, one
    checkpoint folder, role keys in the policy versions, System-1 weights balanced, per-system metrics."""
    from flows.align import AlignError, plan
    from flows.metrics import partition_metrics
    from infra import store
    from tasks.align import AlignConfig
    from tasks.context import RunContext

    _, run_dir = mars_run
    up = store.read_table(run_dir, "updates")
    assert list(up["agent"]) == ["shared"] and up["tokens"].iloc[0] > 0 and up["version_after"].iloc[0] == 1
    assert sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir()) == ["shared"]
    eps = store.read_table(run_dir, "episodes", 1, "rollout")
    assert all(dict(v) == {"system2": 0, "system1": 0} for v in eps["policy_versions"])
    acts = store.load_actions(run_dir, 1, "rollout")
    assert set(acts["agent"]) == {"system1", "system2"} and (acts["policy_version"] == 0).all()
    s1 = acts[acts["system"] == 1]
    assert s1["weight"].sum() == eps["episode_id"].nunique()  # balanced to System 2's trajectory count
    pm = partition_metrics(run_dir, 1, "rollout")
    assert {"coach_score/system1", "coach_score/system2", "system1/compression"} <= set(pm)
    with pytest.raises(AlignError, match="shares its weights 'shared' with system2"):
        with RunContext(run_dir) as run:
            plan(run, AlignConfig(agent="system1"))


@pytest.mark.slow
def test_two_models_flow(prefect_harness, tmp_path):
    """(e) shared_model: false keeps two adapters, two updates, two checkpoint folders."""
    from conftest import MARS

    from flows.config import load_config
    from flows.train import train
    from infra import store

    cfg = load_config("deepresearch-tiny", [f"run.dir={tmp_path}", "run.id=two", *MARS, "pipeline.shared_model=false"])
    run_dir = train(config=cfg)
    up = store.read_table(run_dir, "updates")
    assert sorted(up["agent"]) == ["system1", "system2"] and (up["version_after"] == 1).all()
    assert sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir()) == ["system1", "system2"]
    eps = store.read_table(run_dir, "episodes", 1, "rollout")
    assert all(dict(v) == {"system2": 0, "system1": 0} for v in eps["policy_versions"])
