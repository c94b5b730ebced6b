"""`engines.runner: ray` on a real two-node Ray cluster on loopback: `ray start --head` and a second
`ray start --address`, each with its own temp dir and one CPU; a tiny training iteration whose rollouts
are played by two actors placed one per node (strict_spread); both nodes are stopped afterwards.

Skipped when Ray is not installed (`pip install -e .[ray]`), unless TEAMRL_REQUIRE_RAY=1 (CI)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config

from infra.engines.config import RayConfig
from infra.engines.zero import free_port

ROOT = Path(__file__).resolve().parents[1]
RAY = shutil.which("ray", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.slow
if RAY is None:
    if os.environ.get("TEAMRL_REQUIRE_RAY") == "1":
        pytest.fail("TEAMRL_REQUIRE_RAY=1 but Ray is not installed (pip install -e .[ray])", pytrace=False)
    pytest.skip("Ray is not installed (pip install -e .[ray])", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes on 127.0.0.1 with separate temp dirs; workers import this checkout's code."""
    port = free_port()
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "TEAMRL_PROGRESS": "0",
        "OMP_NUM_THREADS": "1",
    }
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory", str(200 * 2**20)]
    head, worker = tmp_path_factory.mktemp("ray-head"), tmp_path_factory.mktemp("ray-worker")
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                "--port",
                str(port),
                "--temp-dir",
                str(head),
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
                *common,
            ],
            env=env,
            check=True,
            timeout=180,
            capture_output=True,
        )
        subprocess.run(
            [RAY, "start", "--address", f"127.0.0.1:{port}", "--temp-dir", str(worker), *common],
            env=env,
            check=True,
            timeout=180,
            capture_output=True,
        )
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        ray.shutdown()
        subprocess.run([RAY, "stop", "--force"], env=env, timeout=120, capture_output=True)


def test_rollouts_run_on_actors_on_both_nodes(prefect_harness, cluster, tmp_path):
    import ray

    from flows.train import train
    from infra import store
    from tasks.collect_rollouts import ShardPlayer
    from tasks.context import RunContext

    run_dir = train(
        config=tiny_config(
            tmp_path,
            "run.id=ray",
            "iterations=1",
            "evaluate=false",
            "engines.runner=ray",
            f"engines.ray.address={cluster}",
            "engines.ray.rollout_workers=2",
            "engines.ray.placement=strict_spread",
        )
    )
    with RunContext(run_dir) as run:  # the run's actors went with its flow: the same config places them again
        nodes = run.rollout_workers(ShardPlayer).placement()
        assert len(nodes) == 2 and len(set(nodes)) == 2  # one actor per node
        assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == set(nodes)
    eps = store.read_table(run_dir, "episodes", 1, "rollout")
    acts = store.load_actions(run_dir, 1, "rollout")
    assert len(eps) == 8 and eps["episode_id"].is_unique  # 4 questions x group of 2, in order
    assert eps["episode_id"].tolist() == sorted(eps["episode_id"])
    assert set(acts["agent"]) == {"solver", "executor", "verifier"}
    assert (acts["score"].notna() == (acts["status"] == "ok")).all()  # the rest are unscored verifiers (skipped)
    assert all(len(r) == len(lp) > 0 for r, lp in zip(acts["response_ids"], acts["logprobs"]))
    assert set(store.read_table(run_dir, "updates")["agent"]) == {"solver", "executor", "verifier"}


def test_shards_keep_groups_whole():
    from infra.engines.ray_rollouts import shards

    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    parts = shards(groups, 2)
    assert [list(r) for r in parts] == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert [list(r) for r in shards(groups, 9)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # at most one per group
    assert sum(len(r) for r in shards(groups, 3)) == len(groups)


def test_training_ranks_on_both_nodes_make_the_one_rank_update(prefect_harness, cluster, tmp_path):
    """`engines.train_launcher: ray`: ranks 1 and 2 as actors, one per node (strict_spread), rank 0 this
    process; the run ends with the 1-rank run's updates and weights."""
    from safetensors.torch import load_file

    from flows.train import train
    from infra import store
    from infra.policy import checkpoint_dir, latest_version
    from infra.ranks import RankFailed, ray_ranks

    common = ("iterations=1", "evaluate=false", "seed=2", "algorithm.minibatch_size=2")
    one = train(config=tiny_config(tmp_path, "run.id=one", *common))
    ranks = (
        "engines.train_ranks=3",
        "engines.train_launcher=ray",
        f"engines.ray.address={cluster}",
        "engines.ray.placement=strict_spread",
    )
    three = train(config=tiny_config(tmp_path, "run.id=three", *common, *ranks))
    ua, ub = (store.read_table(r, "updates").sort_values("agent") for r in (one, three))
    assert ua["version_after"].tolist() == ub["version_after"].tolist()
    np.testing.assert_allclose(ub["loss"].astype(float), ua["loss"].astype(float), rtol=1e-3, atol=1e-6)
    for agent in ("solver", "executor", "verifier"):
        v = latest_version(one, agent)
        wa, wb = (load_file(checkpoint_dir(r, agent, v) / "adapter_model.safetensors") for r in (one, three))
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-5)
    with ray_ranks(3, 1, dict, (), RayConfig(address=cluster, placement="strict_spread")) as nodes:
        assert len(set(nodes)) == 2  # one rank per node (`dict`: a target every node can import)
    # a rank that raises (int("x", rank=..., world=...)) breaks rank 0's collective: the error names it
    with pytest.raises(RankFailed, match="training rank 1 of 3 failed: TypeError"):
        with ray_ranks(3, 1, int, ("x",), RayConfig(address=cluster)):
            torch.distributed.barrier()
