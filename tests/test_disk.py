"""Disk space: a write that fills the disk leaves no partial file and raises DiskFullError (path and free
space named), and the run resumes once space is freed; checkpoints keep their optimizer state only where the
next update starts, and the weights of every `checkpoint.keep_every`-th version; `runs show` prints the disk
use. The full-disk tests mount a small tmpfs (root only)."""

import errno
import os
import pickle
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from flows.config import ConfigError, load_config
from flows.inspection import disk_use
from infra import store
from infra.disk import DiskFullError, full_disk_errno, writing
from infra.policy import OPTIMIZER, checkpoint_dir, checkpoint_versions, latest_version, prune_checkpoints


@contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` for the block (skips the test where it cannot be mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a tmpfs, and mounting one needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs to simulate a full disk: {r.stderr.strip()}")
    try:
        yield
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)  # a process still holds a file open there


def resize(path: Path, size: str) -> None:
    """Grow (or shrink, down to what it holds) the tmpfs at `path`."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def fill(path: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on the file system at `path`."""
    ballast = path / "ballast"
    with open(ballast, "wb") as fh:
        fh.write(b"\0" * (shutil.disk_usage(path).free - leave))
    return ballast


def leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.startswith(".tmp-"))


def assert_names_disk(e: DiskFullError, path: Path, mount: Path) -> None:
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == str(path)
    assert str(e).startswith(f"no space left on device writing {path} (") and f"MiB free on {mount})" in str(e), str(e)


# -- recognising a full disk ----------------------------------------------------------------------------------
def test_full_disk_is_recognised_however_the_writer_reports_it():
    assert full_disk_errno(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC  # python, pyarrow
    assert full_disk_errno(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
    try:  # torch.save to a Python file: a RuntimeError raised while handling the OSError
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as e:
        assert full_disk_errno(e) == errno.ENOSPC
    # safetensors: only its message says so
    assert full_disk_errno(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert full_disk_errno(OSError(errno.EACCES, "Permission denied")) is None
    assert full_disk_errno(RuntimeError("out of memory")) is None


def test_a_failed_write_removes_its_temporaries_and_keeps_other_errors(tmp_path):
    f, d = tmp_path / ".tmp-f", tmp_path / ".tmp-d"
    with pytest.raises(ValueError, match="boom"):
        with writing(tmp_path / "out", f, d):
            f.write_text("half")
            (d / "x").parent.mkdir()
            (d / "x").write_text("half")
            raise ValueError("boom")
    assert not f.exists() and not d.exists()
    with pytest.raises(DiskFullError) as e:
        with writing(tmp_path / "out", f):
            f.write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not f.exists() and e.value.errno == errno.ENOSPC and str(tmp_path / "out") in str(e.value)
    again = pickle.loads(pickle.dumps(e.value))  # crosses process boundaries (Prefect results, Ray) intact
    assert type(again) is DiskFullError and str(again) == str(e.value) and again.errno == errno.ENOSPC


# -- full disks, for real (a tmpfs) ---------------------------------------------------------------------------
def _coach_rows(n: int, text_bytes: int) -> list[dict]:
    return [
        {
            "run_id": "r",
            "iteration": 1,
            "phase": "rollout",
            "episode_id": f"e{i}",
            "turn": 0,
            "agent": "a",
            "score": 1.0,
            "rationale": os.urandom(text_bytes // 2).hex(),
            "coach_model": "m",
            "latency_s": 0.0,
            "status": "ok",
            "error_kind": None,
        }
        for i in range(n)
    ]


def test_a_partition_write_on_a_full_disk_leaves_nothing_and_names_path_and_space(tmp_path):
    disk = tmp_path / "disk"
    with tmpfs(disk, "64k"):
        rows = _coach_rows(4, 64 * 1024)  # ~256 KiB of incompressible text
        final = store.partition_dir(disk, "coach", 1, "rollout") / "part-a.parquet"
        with pytest.raises(DiskFullError) as e:
            store.write_partition(disk, "coach", 1, "rollout", rows, name="a")
        assert_names_disk(e.value, final, disk)
        assert not leftovers(disk) and not list(disk.rglob("*.parquet"))
        assert not store.partition_exists(disk, "coach", 1, "rollout")
        resize(disk, "4m")  # space freed: the same write succeeds
        store.write_partition(disk, "coach", 1, "rollout", rows, name="a")
        assert store.read_table(disk, "coach")["rationale"].tolist() == [r["rationale"] for r in rows]


@pytest.mark.parametrize(
    "free_kib, optimizer_mib",
    [
        (128, 0),  # the adapter (312 KiB) does not fit (safetensors says so only in its message)
        (1024, 4),  # the adapter fits, its optimizer state does not (torch: a RuntimeError over the OSError)
    ],
)
def test_a_checkpoint_write_on_a_full_disk_leaves_the_last_version_intact(policy, tmp_path, free_kib, optimizer_mib):
    disk = tmp_path / "disk"
    with tmpfs(disk, "16m"):
        policy.save(disk, "a", 1, optimizer_state={"m": torch.ones(1000)})
        before = {p: p.read_bytes() for p in (disk / "checkpoints").rglob("*") if p.is_file()}
        ballast = fill(disk, free_kib * 1024)
        state = {"m": torch.ones(optimizer_mib * 2**18)} if optimizer_mib else None
        with pytest.raises(DiskFullError) as e:
            policy.save(disk, "a", 2, optimizer_state=state)
        assert_names_disk(e.value, checkpoint_dir(disk, "a", 2), disk)
        assert not leftovers(disk) and not checkpoint_dir(disk, "a", 2).exists()
        assert {p: p.read_bytes() for p in (disk / "checkpoints").rglob("*") if p.is_file()} == before
        assert latest_version(disk, "a") == 1
        ballast.unlink()  # space freed: the same save succeeds
        policy.save(disk, "a", 2, optimizer_state=state)
        assert latest_version(disk, "a") == 2 and (checkpoint_dir(disk, "a", 2) / "adapter_model.safetensors").exists()


# -- pruning --------------------------------------------------------------------------------------------------
def _fake_checkpoints(run_dir: Path, agent: str, versions: range, latest: int) -> None:
    for v in versions:
        d = checkpoint_dir(run_dir, agent, v)
        d.mkdir(parents=True)
        (d / "adapter_model.safetensors").write_bytes(b"w" * 100)
        (d / "meta.json").write_text("{}")
        if v:  # version 0 (the initial weights) is saved without optimizer state
            (d / OPTIMIZER).write_bytes(b"o" * 200)
    (run_dir / "checkpoints" / agent / "latest").write_text(str(latest))


def _kept(run_dir: Path, agent: str) -> tuple[list[int], list[int]]:
    """(versions on disk, versions with optimizer state)."""
    vs = checkpoint_versions(run_dir, agent)
    return vs, [v for v in vs if (checkpoint_dir(run_dir, agent, v) / OPTIMIZER).exists()]


def test_by_default_every_version_is_kept_and_optimizer_state_only_in_the_latest(tmp_path):
    _fake_checkpoints(tmp_path, "a", range(6), latest=5)
    assert prune_checkpoints(tmp_path, "a", keep_every=1) == 4 * 200
    assert _kept(tmp_path, "a") == ([0, 1, 2, 3, 4, 5], [5])
    assert prune_checkpoints(tmp_path, "a", keep_every=1) == 0  # idempotent


def test_keep_every_keeps_every_kth_the_latest_the_registered_and_where_training_resumes(tmp_path):
    _fake_checkpoints(tmp_path, "a", range(10), latest=8)  # v9: written, its pointer not moved (a kill)
    freed = prune_checkpoints(tmp_path, "a", keep_every=3, keep={4}, resume={7})
    # weights: multiples of 3, registered 4, resume 7, latest 8 and the unfinished 9 above it
    assert _kept(tmp_path, "a") == ([0, 3, 4, 6, 7, 8, 9], [7, 8, 9])
    assert freed == 3 * (100 + 200 + 2) + 3 * 200  # v1, v2, v5 whole; v3, v4, v6's optimizer state
    assert not leftovers(tmp_path)
    (tmp_path / "checkpoints" / "a" / "latest").write_text("9")  # the save finished; the next update is done
    prune_checkpoints(tmp_path, "a", keep_every=3, keep={4})
    assert _kept(tmp_path, "a") == ([0, 3, 4, 6, 9], [9])
    with pytest.raises(ValueError, match="keep_every must be at least 1"):
        prune_checkpoints(tmp_path, "a", keep_every=0)


def test_keep_every_is_a_described_config_field():
    assert load_config("tiny").checkpoint.keep_every == 1
    assert load_config("tiny", ["checkpoint.keep_every=5"]).checkpoint.keep_every == 5
    with pytest.raises(ConfigError, match="checkpoint.keep_every"):
        load_config("tiny", ["checkpoint.keep_every=0"])
    from infra.policy import CheckpointConfig

    assert "every this-many-th version" in CheckpointConfig.model_fields["keep_every"].description


def test_disk_use_splits_checkpoints_optimizer_state_and_tables(tmp_path):
    _fake_checkpoints(tmp_path, "a", range(3), latest=2)
    store.write_partition(tmp_path, "coach", 1, "rollout", _coach_rows(2, 100), name="a")
    (tmp_path / "summary.md").write_text("x" * 7)
    table = sum(p.stat().st_size for p in (tmp_path / "coach").rglob("*.parquet"))
    ckpt = 3 * 100 + 3 * 2 + 1  # weights, meta.json, the `latest` pointer
    assert disk_use(tmp_path) == {
        "checkpoints": ckpt,
        "optimizer state": 2 * 200,
        "tables": table,
        "other": 7,
        "total": ckpt + 400 + table + 7,
    }


def test_registered_checkpoints_are_found_per_agent(tmp_path):
    from mlflow.tracking import MlflowClient

    from infra.registry import register_agents, registered_checkpoints

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    mine, other = client.create_run(exp).info.run_id, client.create_run(exp).info.run_id
    register_agents(client, mine, "p", {"solver": 3, "verifier": 1}, {}, None)
    register_agents(client, mine, "p", {"solver": 5}, {}, None)  # finished again after training on
    register_agents(client, other, "p", {"solver": 9}, {}, None)
    assert registered_checkpoints(client, mine) == {"solver": {3, 5}, "verifier": {1}}


# -- whole runs (slow) ----------------------------------------------------------------------------------------
def _blocks(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_training_on_a_full_disk_stops_cleanly_and_resumes_to_identical_tables(trained_run, tmp_path):
    """The tiny preset trained in a run folder on a tmpfs of half the size it needs fails in one of its
    writes, names the file and the free space, and leaves nothing half-written; with the tmpfs enlarged,
    --resume finishes it with the tables of the uninterrupted run."""
    from test_resume_faults import _teamrl, assert_same_as_uninterrupted

    _, ref_dir = trained_run
    disk = tmp_path / "disk"
    wide = {"COLUMNS": "1000"}  # the CLI's message on one line
    with tmpfs(disk, f"{_blocks(Path(ref_dir)) // 2 // 4096 * 4}k"):
        args = [
            "train",
            "tiny",
            "--set",
            f"run.dir={disk}",
            "--set",
            "run.id=full",
            "--set",
            "seed=1",
            "--set",
            f"run.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ]
        rc, out = _teamrl(args, tmp_path / "full.log", wide)
        assert rc == 2, out[-3000:]  # a TeamrlError: one line, no traceback
        stopped = [ln for ln in out.splitlines() if ln.startswith("error: ") and "no space left on device" in ln]
        assert stopped, out[-3000:]
        assert f"no space left on device writing {disk / 'full'}/" in stopped[0]
        assert f"MiB free on {disk})" in stopped[0] and "--resume full" in stopped[0]
        assert not leftovers(disk), "half-written files were left behind"
        resize(disk, "512m")
        rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={disk}", "--resume", "full"], tmp_path / "resumed.log")
        assert rc == 0, out[-3000:]
        assert_same_as_uninterrupted(ref_dir, disk / "full")


@pytest.mark.slow
def test_pruned_run_resumes_evaluates_and_shows_its_disk_use(trained_run, tmp_path):
    """checkpoint.keep_every=2, killed in iteration 2 between the solver's new checkpoint and its `updates`
    row (a resume then updates the solver again from version 1, with version 1's optimizer state); resumed,
    it has the uninterrupted run's tables, weights of versions 0 and 2 only, optimizer state in version 2
    only; `eval --model` plays its registered agents, and `runs show` prints its disk use."""
    from conftest import assert_same_table
    from test_resume_faults import TABLES, _teamrl
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.inspection import disk_summary

    _, ref_dir = trained_run
    run_dir = tmp_path / "pruned"
    args = [
        "train",
        "tiny",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "run.id=pruned",
        "--set",
        "seed=1",
        "--set",
        "checkpoint.keep_every=2",
    ]
    # partition writes: the evaluation at 0 (actions, episodes, coach), iteration 1 (those, advantages and
    # 3 updates), iteration 2's rollouts (4): the 15th is the solver's `updates` row of iteration 2
    rc, out = _teamrl(args, tmp_path / "killed.log", {"TEAMRL_FAULT": "partition:15"})
    assert rc == -signal.SIGKILL and checkpoint_dir(run_dir, "solver", 2).is_dir(), out[-3000:]
    assert not store.partition_exists(run_dir, "updates", 2, "rollout", name="solver"), "killed elsewhere"
    rc, out = _teamrl(["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "pruned"], tmp_path / "resumed.log")
    assert rc == 0, out[-3000:]

    for table in TABLES:
        assert_same_table(ref_dir, run_dir, table)
    assert latest_version(run_dir, "verifier") == 0 and _kept(run_dir, "verifier") == ([0], [])  # never scored
    for agent in ("solver", "executor"):
        assert latest_version(run_dir, agent) == latest_version(ref_dir, agent) == 2
        # v1 stays whole while iteration 2, which started from it, is the last one (it can be redone)
        assert _kept(run_dir, agent) == ([0, 1, 2], [1, 2])
        prune_checkpoints(run_dir, agent, keep_every=2, resume={2})  # as a third iteration's pruning would
        assert _kept(run_dir, agent) == ([0, 2], [2])
    assert not leftovers(run_dir)

    res = CliRunner().invoke(app, ["eval", "--model", "models:/tiny-solver@best", "--dir", str(tmp_path)])
    assert res.exit_code == 0 and "success_rate" in res.output, res.output
    (team,) = tmp_path.glob("eval-pruned-*")
    assert not list(team.rglob(OPTIMIZER)), "an evaluation copied optimizer state"
    res = CliRunner().invoke(app, ["eval", "pruned", "--iteration", "1", "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "pruned (checkpoint.keep_every); versions on disk: 0, 2" in res.output, res.output

    res = CliRunner().invoke(app, ["runs", "show", "pruned", "--dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    use = disk_use(run_dir)
    assert use["optimizer state"] == sum(p.stat().st_size for p in run_dir.rglob(OPTIMIZER)) > 0
    assert disk_summary(run_dir) in res.output and "MLflow artifacts" in res.output
