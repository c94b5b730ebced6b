"""`algorithm.measure_update`: off, an update trains exactly as with it on and records no KL or gain; the
strategies whose certificate needs the measurement refuse it."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import redo_update
from pydantic import ValidationError
from safetensors.torch import load_file

from infra import store
from infra.policy import checkpoint_dir
from tasks.algorithm import AlgorithmConfig


@pytest.mark.parametrize("strategy", ["stale", "teamtr"])
def test_certified_strategies_refuse_to_skip_the_measurement(strategy):
    with pytest.raises(ValidationError, match=f"measure_update=false with strategy={strategy}"):
        AlgorithmConfig(strategy=strategy, kl_delta=0.05, measure_update=False)
    assert not AlgorithmConfig(measure_update=False).measure_update  # joint may


@pytest.mark.slow
def test_an_unmeasured_update_trains_the_same_and_records_no_kl(trained_run, tmp_path):
    _, src = trained_run
    run_dir = tmp_path / "copy"
    shutil.copytree(src, run_dir)
    before = store.read_table(run_dir, "updates", 1, "rollout", name="solver").iloc[0]
    assert before["kl"] is not None and before["surrogate_gain"] is not None  # measured by default
    weights = load_file(checkpoint_dir(run_dir, "solver", 1) / "adapter_model.safetensors")

    row = redo_update(run_dir, 1, "solver", measure_update=False)
    assert row["kl"] is None and row["surrogate_gain"] is None and row["certificate"] is None
    assert row["loss"] == before["loss"] and row["tokens"] == before["tokens"] and row["version_after"] == 1
    again = load_file(checkpoint_dir(run_dir, "solver", 1) / "adapter_model.safetensors")
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)
