"""Integration: the tiny preset through the real Prefect train flow."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import table_content, tiny_config

from infra import store
from infra.policy import latest_version

AGENTS = ["solver", "executor", "verifier"]
# the tiny model's executor never prints a number, so its verifier has nothing to report: it is never
# scored (pipelines/mathchat/rubric.py) and its updates are skipped ("no scored actions for this agent")
TRAINED = ["solver", "executor"]
pytestmark = pytest.mark.slow


def test_every_table_has_rows(trained_run):
    _, run_dir = trained_run
    for table in ("episodes", "actions", "coach", "advantages", "updates"):
        df = store.read_table(run_dir, table)
        assert len(df) > 0, table
    eps = store.load_episodes(run_dir)
    assert set(eps["phase"]) == {"rollout", "eval"}
    assert sorted(eps[eps.phase == "eval"]["iteration"].unique()) == [0, 2]
    assert sorted(eps[eps.phase == "rollout"]["iteration"].unique()) == [1, 2]
    # 4 questions x group of 2 per training iteration, 8 held-out questions per evaluation
    assert (eps[eps.phase == "rollout"].groupby("iteration").size() == 8).all()
    assert (eps[eps.phase == "eval"].groupby("iteration").size() == 8).all()


def test_actions_joined_with_scores_for_all_agents(trained_run):
    _, run_dir = trained_run
    df = store.load_actions(run_dir, phase="rollout")
    assert sorted(df["agent"].unique()) == sorted(AGENTS)
    ok = df["status"] == "ok"
    assert set(df.loc[ok, "agent"]) == set(TRAINED) and (df.loc[~ok, "status"] == "skipped").all()
    assert df.loc[ok, "score"].between(0, 10).all() and df.loc[~ok, "score"].isna().all()
    assert (df["weight"] == ok.astype(int)).all()  # an unscored action gets no gradient
    assert isinstance(df["response_ids"].dtype, pd.ArrowDtype)
    for r in df.to_dict("records"):
        n = len(r["response_ids"])
        assert n == len(r["logprobs"]) == len(r["ref_logprobs"]) == len(r["advantages"]) == len(r["loss_mask"]) > 0
        assert all(lp <= 0 for lp in r["logprobs"])
    # the first iteration acts with the untrained adapters (LoRA B = 0): policy == reference
    it1 = df[df.iteration == 1]
    assert max(np.abs(np.array(a) - np.array(b)).max() for a, b in zip(it1.logprobs, it1.ref_logprobs)) < 1e-4
    # iteration 2 acts with updated adapters, so some token log-probs differ from the reference
    it2 = df[df.iteration == 2]
    assert max(np.abs(np.array(a) - np.array(b)).max() for a, b in zip(it2.logprobs, it2.ref_logprobs)) > 1e-4
    assert set(it2[it2["agent"].isin(TRAINED)]["policy_version"]) == {1}
    assert set(it2[~it2["agent"].isin(TRAINED)]["policy_version"]) == {0}  # never scored, never updated


def test_checkpoint_versions_advance(trained_run):
    _, run_dir = trained_run
    up = store.load_updates(run_dir).sort_values(["iteration", "agent"])
    assert len(up) == 2 * len(AGENTS)
    trained = up["agent"].isin(TRAINED)
    assert (up["skipped"] == ~trained).all()
    assert (up.loc[~trained, "reason"] == "no scored actions for this agent").all()
    assert (up["version_after"] == up["version_before"] + trained.astype(int)).all()
    # the trainer's statistics: a gradient norm and a clip fraction per update, no KL-to-reference term
    assert (up.loc[trained, "grad_norm"] > 0).all() and up.loc[trained, "clip_frac"].between(0, 1).all()
    assert up["kl_ref"].isna().all() and up.loc[~trained, "grad_norm"].isna().all()
    for a in AGENTS:
        last = 2 if a in TRAINED else 0
        assert latest_version(run_dir, a) == last
        for v in range(last + 1):
            assert (Path(run_dir) / "checkpoints" / a / f"v{v:04d}" / "adapter_model.safetensors").exists()


def test_mlflow_has_params_and_metrics(trained_run):
    from mlflow.tracking import MlflowClient

    root, run_dir = trained_run
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(root).resolve() / 'mlflow.db'}")
    run = client.get_run((Path(run_dir) / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.estimator"] == "reinforce_pp"
    for key in (
        "success_rate",
        "coach_score/solver",
        "loss/executor",
        "kl/executor",
        "grad_norm/executor",
        "clip_frac/executor",
        "skipped/verifier",
        "rollout_tokens_per_s",
        "seconds/collect_rollouts",
        "eval/success_rate",
    ):
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "success_rate")] == [1, 2]
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert "checkpoints/solver" in arts


def test_same_seed_same_tables_and_resume(trained_run, tmp_path):
    """A second run with the same seed, interrupted after iteration 1's coach stage and resumed,
    ends with exactly the tables of the uninterrupted run."""
    import shutil

    from flows.train import train

    root, ref_dir = trained_run
    cfg = tiny_config(tmp_path, "run.id=again", "seed=1")
    run_dir = Path(train(config=cfg))
    for table in ("episodes", "actions", "coach", "advantages", "updates"):
        pd.testing.assert_frame_equal(table_content(ref_dir, table), table_content(run_dir, table), obj=table)
    # simulate a crash in iteration 2 after the coach stage: later stages' outputs are gone
    for table in ("advantages", "updates"):
        shutil.rmtree(run_dir / table / "iteration=2")
    shutil.rmtree(run_dir / "episodes" / "iteration=2" / "phase=eval")
    (run_dir / "mlflow_run_id").unlink()  # (a fresh MLflow run is made when the id file is lost)
    before = (run_dir / "actions" / "iteration=2" / "phase=rollout" / "part-all.parquet").stat().st_mtime_ns
    train(config=cfg, resume="again")
    after = (run_dir / "actions" / "iteration=2" / "phase=rollout" / "part-all.parquet").stat().st_mtime_ns
    assert before == after, "finished rollouts were redone"
    for table in ("episodes", "actions", "coach", "advantages", "updates"):
        pd.testing.assert_frame_equal(table_content(ref_dir, table), table_content(run_dir, table), obj=table)


def test_same_run_id_refused(trained_run):
    from flows.train import train

    root, _ = trained_run
    with pytest.raises(FileExistsError, match="already exists"):
        train(config=tiny_config(root, "run.id=spine"))


def test_second_writer_refused_while_the_run_is_locked(trained_run):
    from flows.train import train
    from infra.runs import RunLockedError, run_lock

    root, run_dir = trained_run
    before = sorted(str(p) for p in Path(run_dir).rglob("*") if p.name != ".lock")
    with run_lock(run_dir):  # another process writing this run
        with pytest.raises(RunLockedError, match=r"run 'spine' is being written by another process \(lock "):
            train(config=tiny_config(root), resume="spine")
    assert sorted(str(p) for p in Path(run_dir).rglob("*") if p.name != ".lock") == before


def test_full_copy_per_agent(prefect_harness, tmp_path):
    """`model.weights=full`: each agent trains its own full copy; the frozen base stays the reference."""
    from flows.train import train

    run_dir = Path(train(config=tiny_config(tmp_path, "model.weights=full", "iterations=1", "evaluate=false")))
    for a in TRAINED:
        assert (run_dir / "checkpoints" / a / "v0001" / "model.safetensors").exists()
    up = store.load_updates(run_dir)
    assert dict(zip(up["agent"], up["version_after"])) == {a: int(a in TRAINED) for a in AGENTS}


def test_cli_train_and_runs_show(prefect_harness, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "train",
            "tiny",
            "--set",
            f"run.dir={tmp_path}",
            "--set",
            "iterations=1",
            "--set",
            "run.id=cli",
            "--set",
            "evaluate=false",
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["runs", "show", "cli", "--dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "rollout" in res.output and "solver" in res.output
    res = runner.invoke(app, ["runs", "list", "--dir", str(tmp_path)])
    assert "cli" in res.output
    res = runner.invoke(app, ["runs", "show", "nope", "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "no run 'nope'" in res.output


def test_outcome_coach_pass_at_k_and_summary(prefect_harness, tmp_path):
    """`coach.backend=outcome` gives every action the sparse episode outcome; eval samples give pass@k;
    the run ends with a summary plot and table (also an MLflow artifact). Without a KL penalty
    (kl_coef = 0) no reference pass runs."""
    from flows.metrics import partition_metrics
    from flows.train import train

    run_dir = Path(
        train(
            config=tiny_config(
                tmp_path,
                "coach.backend=outcome",
                "iterations=1",
                "algorithm.kl_coef=0",
                "rollout.eval_samples=2",
                "pipeline.eval_size=4",
            )
        )
    )
    df = store.load_actions(run_dir, phase="rollout")
    eps = store.load_episodes(run_dir, phase="rollout").set_index("episode_id")["outcome"]
    assert (df["score"].to_numpy() == 10.0 * eps.loc[df["episode_id"]].to_numpy()).all()
    assert df["ref_logprobs"].isna().all() and df["loss_mask"].map(len).eq(df["response_ids"].map(len)).all()
    assert set(df["coach_model"]) == {"outcome"}
    ev = store.load_episodes(run_dir, iteration=1, phase="eval")
    assert len(ev) == 4 * (1 + 2)  # greedy + 2 samples per held-out question
    m = partition_metrics(run_dir, 1, "eval")
    assert "pass_at_2" in m and 0.0 <= m["pass_at_2"] <= 1.0
    assert 0.0 <= m["success_ci_low"] <= m["success_rate"] <= m["success_ci_high"] <= 1.0
    assert m["tool_use/executor"] >= 0.0 and m["tool_use/solver"] == 0.0
    assert (run_dir / "summary.png").stat().st_size > 10_000
    assert "Held-out success" in (run_dir / "summary.md").read_text()


def test_teamtr_resamples_with_the_partially_updated_team(teamtr_run):
    _, run_dir = teamtr_run
    up = store.read_table(run_dir, "updates").sort_values(["iteration", "phase"])
    eps = store.read_table(run_dir, "episodes")
    assert (up["strategy"] == "teamtr").all() and (up["skipped"] == ~up["agent"].isin(TRAINED)).all()
    version = lambda a, k: k if a in TRAINED else 0  # noqa: E731  (an agent's version after iteration k)
    for k, rows in up.groupby("iteration"):
        by_phase = dict(zip(rows["phase"], rows["agent"]))  # the phase an agent learnt from gives its position
        assert sorted(by_phase) == ["resample-1", "resample-2", "rollout"]
        first, second, third = by_phase["rollout"], by_phase["resample-1"], by_phase["resample-2"]
        assert sorted([first, second, third]) == sorted(AGENTS)
        start = {a: version(a, k - 1) for a in AGENTS}
        played = {ph: dict(g["policy_versions"].iloc[0]) for ph, g in eps[eps.iteration == k].groupby("phase")}
        assert played["rollout"] == start
        assert played["resample-1"] == start | {first: version(first, k)}  # the first agent already updated
        assert played["resample-2"] == start | {first: version(first, k), second: version(second, k)}
        assert dict(zip(rows["agent"], rows["version_after"])) == {a: version(a, k) for a in AGENTS}
    up = up[~up["skipped"]]
    # the trust region holds, and the certificate is the gain minus the penalty (tasks/certificate.py)
    assert (up["kl"].astype(float) <= 0.05).all()
    np.testing.assert_allclose(
        up["certificate"].astype(float), up["surrogate_gain"].astype(float) - up["penalty"].astype(float), rtol=1e-9
    )
    assert (up["penalty"].astype(float) >= 0).all()


def test_teamtr_logs_certificates_and_resample_cost(teamtr_run):
    from mlflow.tracking import MlflowClient

    root, run_dir = teamtr_run
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(root).resolve() / 'mlflow.db'}")
    run_id = (Path(run_dir) / "mlflow_run_id").read_text().strip()
    up = store.read_table(run_dir, "updates", 2)
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "stage/task_certificate")}
    assert hist[2] == pytest.approx(float(up["certificate"].astype(float).sum()))
    # each batch's held-out groups (2 of 4 questions) carry rewards but train nobody
    for phase, adv in store.read_table(run_dir, "advantages", 2).groupby("phase"):
        held = adv[adv["held_out"].astype(bool)]
        assert (held["weight"] == 0).all() and held["reward"].notna().any()
        eps = store.read_table(run_dir, "episodes", 2, phase).set_index("episode_id")["group_id"]
        assert eps[held["episode_id"]].nunique() == 2 and eps.nunique() == 4, phase
    # two resamples of as many questions as the stage-start rollouts: 200% more episodes than `stale`
    assert {m.value for m in client.get_metric_history(run_id, "resample/extra_episodes_frac")} == {2.0}
    for a in TRAINED:
        assert client.get_metric_history(run_id, f"penalty/{a}")


def test_stale_strategy_trains_every_agent_on_the_stage_start_rollouts(prefect_harness, tmp_path):
    """...and so, with one adapter per agent (an agent's update depends on its own weights and the cached
    rollouts only) and no groups held out for a certificate, computes exactly `joint`'s updates:
    benchmarks/README.md relies on this."""
    from safetensors.torch import load_file

    from flows.train import train
    from tasks.update import FEW_HELD_OUT

    stale = ("iterations=1", "evaluate=false", "algorithm.strategy=stale", "algorithm.certify_holdout=0")
    run_dir = train(config=tiny_config(tmp_path / "stale", *stale))
    up = store.read_table(run_dir, "updates")
    assert set(up["phase"]) == {"rollout"} and set(up["strategy"]) == {"stale"} and len(up) == 3
    assert set(store.read_table(run_dir, "episodes")["phase"]) == {"rollout"}
    joint = train(config=tiny_config(tmp_path / "joint", "iterations=1", "evaluate=false"))
    # without held-out groups, no certificate (nor its gain, measured on those groups), and the reason says so
    up, up_joint = (u[u["agent"].isin(TRAINED)] for u in (up, store.read_table(joint, "updates")))
    assert up["certificate"].isna().all() and up["surrogate_gain"].isna().all()
    assert up["reason"].str.contains(FEW_HELD_OUT, regex=False).all()
    assert up_joint["certificate"].isna().all() and up_joint["surrogate_gain"].notna().all()
    for a in TRAINED:
        w = [load_file(Path(d) / "checkpoints" / a / "v0001" / "adapter_model.safetensors") for d in (run_dir, joint)]
        assert w[0].keys() == w[1].keys() and all(torch.equal(w[0][k], w[1][k]) for k in w[0])


def test_resume_can_extend_a_finished_run_but_not_shorten_it(prefect_harness, tmp_path):
    import yaml

    from flows.train import train
    from infra.runs import RunShrinkError

    cfg = tiny_config(tmp_path, "run.id=ext", "iterations=1", "evaluate=false")
    run_dir = Path(train(config=cfg))
    before = yaml.safe_load((run_dir / "config.yaml").read_text())
    train(config=cfg, resume="ext", iterations=2)
    after = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert after == before | {"iterations": 2}  # same run_id, nonce and flow run
    assert sorted(store.read_table(run_dir, "updates")["iteration"].unique()) == [1, 2]
    with pytest.raises(RunShrinkError, match="extended, not shortened"):
        train(config=cfg, resume="ext", iterations=1)


def test_eval_every_gives_a_held_out_curve(prefect_harness, tmp_path):
    from flows.train import train

    run_dir = train(config=tiny_config(tmp_path, "iterations=3", "eval_every=2", "rollout.questions=2"))
    eps = store.read_table(run_dir, "episodes", phase="eval")
    assert sorted(eps["iteration"].unique()) == [0, 2, 3]  # before, every 2nd iteration, after the last


def test_iteration_sub_flows_run_without_the_heartbeat_on_settings_made_once():
    """`no_heartbeat` switches Prefect's flow-run heartbeat off for the block, keeps every other setting, and
    builds that settings object once per settings in force (Prefect's `temporary_settings` rebuilds it on each
    entry, about 0.1 s per iteration)."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    from flows.train import no_heartbeat

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        with no_heartbeat():
            first = get_current_settings()
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
            assert PREFECT_API_URL.value() == "http://127.0.0.1:1/api"
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 30
        with no_heartbeat():
            assert get_current_settings() is first
        with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:2/api"}), no_heartbeat():
            assert PREFECT_API_URL.value() == "http://127.0.0.1:2/api"
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
