"""Operating a run: the MLflow model registry (a registered model per agent, `best` follows held-out
success, `teamrl eval --model models:/...@best` loads it back) and the Prefect run names and artifacts."""

import filecmp
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from infra.registry import SUCCESS_TAG, model_name, register_agents

AGENTS = ["solver", "executor", "verifier"]


def _mlflow_run_with_checkpoint(client, exp_id, tmp_path, agent, version):
    run = client.create_run(exp_id)
    d = tmp_path / f"ck-{run.info.run_id}" / agent / f"v{version:04d}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_text(run.info.run_id)
    client.log_artifacts(run.info.run_id, str(d.parent.parent), "checkpoints")
    return run.info.run_id


def test_best_moves_only_on_higher_held_out_success_and_registration_is_idempotent(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    tags = {"teamrl.model": "tiny", "teamrl.weights": "lora"}
    runs = [_mlflow_run_with_checkpoint(client, exp, tmp_path, "solver", 2) for _ in range(3)]
    first = register_agents(client, runs[0], "p", {"solver": 2}, tags, 0.30)
    again = register_agents(client, runs[0], "p", {"solver": 2}, tags, 0.30)  # a resumed run finishing twice
    worse = register_agents(client, runs[1], "p", {"solver": 2}, tags, 0.20)
    better = register_agents(client, runs[2], "p", {"solver": 2}, tags, 0.50)
    assert [r.version for r in (first + again + worse + better)] == ["1", "1", "2", "3"]
    assert [r.best for r in (first + worse + better)] == [True, False, True]
    name = model_name("p", "solver")
    best = client.get_model_version_by_alias(name, "best")
    assert str(best.version) == "3" and best.tags[SUCCESS_TAG] == "0.500000" and best.tags["teamrl.agent"] == "solver"
    assert str(client.get_model_version_by_alias(name, "latest").version) == "3"  # MLflow's reserved alias
    assert best.source.endswith("/checkpoints/solver/v0002")
    no_eval = register_agents(
        client, _mlflow_run_with_checkpoint(client, exp, tmp_path, "solver", 1), "p", {"solver": 1}, tags, None
    )
    assert not no_eval[0].best and str(client.get_model_version_by_alias(name, "best").version) == "3"


def test_model_name_is_registry_safe():
    assert model_name("mathchat smol/x", "solver") == "mathchat-smol-x-solver"


@pytest.mark.slow
def test_every_agent_is_registered_and_loads_back_for_evaluation(trained_run):
    from mlflow.tracking import MlflowClient

    from infra.policy import latest_version
    from infra.tracking import default_tracking_uri

    root, run_dir = trained_run
    uri = default_tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    for a in AGENTS:
        mv = client.get_model_version_by_alias(f"tiny-{a}", "best")
        assert mv.tags["teamrl.run_id"] == Path(run_dir).name and mv.tags["teamrl.agent"] == a
        assert mv.tags["teamrl.checkpoint"] == str(latest_version(run_dir, a)) and SUCCESS_TAG in mv.tags
        version_dir = f"checkpoints/{a}/v{latest_version(run_dir, a):04d}"
        logged = {f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(mv.run_id, version_dir)}
        assert "adapter_model.safetensors" in logged and "optimizer.pt" not in logged  # weights only

    res = CliRunner().invoke(app, ["eval", "--model", "models:/tiny-executor@best", "--dir", str(root)])
    assert res.exit_code == 0, res.output
    assert "success_rate" in res.output
    evals = sorted(p for p in Path(root).iterdir() if p.name.startswith("eval-spine"))
    assert len(evals) == 1
    for a in AGENTS:  # the registered executor and the run's own latest solver and verifier
        ours = Path(run_dir) / "checkpoints" / a / f"v{latest_version(run_dir, a):04d}"
        assert filecmp.cmp(
            ours / "adapter_model.safetensors",
            evals[0] / "checkpoints" / a / "v0000" / "adapter_model.safetensors",
            shallow=False,
        )
    # the same checkpoints, greedy: the registered team plays exactly as the run's final evaluation did
    from infra import store

    mine = store.read_table(evals[0], "episodes", 0, "eval").sort_values("episode_id")
    theirs = store.read_table(run_dir, "episodes", 2, "eval").sort_values("episode_id")
    assert mine["success"].tolist() == theirs["success"].tolist()
    assert mine["final_answer"].tolist() == theirs["final_answer"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize(
    "uri, message",
    [
        ("tiny-solver@best", "not a registry URI"),
        ("models:/nope-solver@best", "registered models in"),
        ("models:/tiny-solver/99", "registered models in"),
    ],
)
def test_eval_model_errors_name_the_problem(trained_run, uri, message):
    root, _ = trained_run
    res = CliRunner().invoke(app, ["eval", "--model", uri, "--dir", str(root)])
    assert res.exit_code == 2 and message in res.output, res.output


@pytest.mark.slow
def test_prefect_run_names_and_artifacts(trained_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        ArtifactFilterType,
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterParentFlowRunId,
    )

    _, run_dir = trained_run
    with get_client(sync_client=True) as client:
        names = {r.name for r in client.read_flow_runs()}
        assert {"train-mathchat-spine", "iteration-1", "iteration-2"} <= names
        tasks = {t.name for t in client.read_task_runs()}
        assert {f"update-{a}" for a in AGENTS} <= tasks
        table = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["spine-agents"])))
        assert len(table) == 2 and {"iteration 1", "iteration 2"} == {a.description.split(":")[0] for a in table}
        assert all(a.type == "table" and '"agent": "solver"' in a.data and "coach_score" in a.data for a in table)
        (link,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["spine-mlflow"])))
        assert link.type == "markdown" and "/#/experiments/" in link.data
        # this run's flow run and its `iteration-<k>` sub-flow runs: their progress artifacts all completed
        top = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["train-mathchat-spine"]))
        )
        subs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[r.id for r in top]))
        )
        progress = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                type=ArtifactFilterType(any_=["progress"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in top + subs]),
            )
        )
        assert {r.name for r in subs} == {"iteration-1", "iteration-2"}
        assert progress and all(float(a.data) == 100.0 for a in progress)
        # the tiny team's verifier is never scored, so its update has no batch and no progress bar (test_train_flow.py)
        assert {f"update {a} it=1" for a in ("solver", "executor")} <= {a.description for a in progress}
        assert any(a.description.startswith("rollouts it=1 rollout") for a in progress)
