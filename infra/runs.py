"""Run folders: creation (config.yaml written last-step-atomically), lookup and the single-writer lock."""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import yaml

from infra.errors import TeamrlError

log = logging.getLogger(__name__)


class RunConfigError(TeamrlError, ValueError):
    """A run's config.yaml cannot be read: not valid YAML, not a mapping, or not a readable file."""


class RunLockedError(TeamrlError, RuntimeError):
    """Another process is writing this run."""


class RunShrinkError(TeamrlError, ValueError):
    """A resumed run cannot get fewer iterations than it was configured for."""


def new_run_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def create_run(root: str | Path, run_id: str, config: dict, flow_run_id: str | None = None) -> Path:
    """Make runs/<run_id>/ with its resolved config.yaml (and the Prefect flow run that created it);
    refuses an existing run id."""
    d = Path(root) / run_id
    if (d / "config.yaml").exists():
        raise FileExistsError(f"run {run_id!r} already exists in {root}; use --resume {run_id} to continue it")
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".config-{uuid.uuid4().hex}.yaml"
    tmp.write_text(
        yaml.safe_dump(
            {"run_id": run_id, "nonce": uuid.uuid4().hex, "flow_run_id": flow_run_id} | config, sort_keys=False
        )
    )
    os.replace(tmp, d / "config.yaml")
    return d


def extend_run(run_dir: str | Path, iterations: int) -> None:
    """Raise a run's saved iteration count (config.yaml rewritten atomically; its identity kept)."""
    raw = read_run_config(run_dir)
    if iterations < raw["iterations"]:
        raise RunShrinkError(
            f"run {Path(run_dir).name!r} is configured for {raw['iterations']} iterations; "
            f"it can be extended, not shortened to {iterations}"
        )
    tmp = Path(run_dir) / f".config-{uuid.uuid4().hex}.yaml"
    tmp.write_text(yaml.safe_dump(raw | {"iterations": iterations}, sort_keys=False))
    os.replace(tmp, Path(run_dir) / "config.yaml")


def read_run_config(run_dir: str | Path) -> dict:
    p = Path(run_dir) / "config.yaml"
    if not p.exists():
        raise FileNotFoundError(f"no run at {run_dir} (missing config.yaml)")
    fix = "fix it, or move the run folder away"
    try:
        data = p.read_bytes()
    except OSError as e:
        raise RunConfigError(f"{p}: cannot be read ({e}); {fix}") from e
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise RunConfigError(f"{p}, line {line}: not UTF-8 text; {fix}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        line, problem = _yaml_problem(e, text)
        raise RunConfigError(f"{p}, line {line}: not valid YAML ({problem}); {fix}") from e
    if not isinstance(raw, dict):
        what = "empty" if raw is None else f"a {type(raw).__name__}"
        raise RunConfigError(f"{p}, line 1: {what}, not a mapping of config fields; {fix}")
    return raw


def _yaml_problem(e: yaml.YAMLError, text: str) -> tuple[int, str]:
    """(line, what is wrong) of a YAML error: a parser error carries a mark, a reader error a position."""
    if mark := getattr(e, "problem_mark", None) or getattr(e, "context_mark", None):
        return mark.line + 1, getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    position = getattr(e, "position", 0)
    return text.count("\n", 0, position) + 1, getattr(e, "reason", None) or str(e)


def find_run(root: str | Path, run_id: str) -> Path:
    d = Path(run_id) if (Path(run_id) / "config.yaml").exists() else Path(root) / run_id
    if not (d / "config.yaml").exists():
        known = ", ".join(list_runs(root)[-5:]) or "none"
        raise FileNotFoundError(f"no run {run_id!r} under {root} (recent: {known})")
    return d


def find_by_flow_run(root: str | Path, flow_run_id: str) -> Path | None:
    """The run a Prefect flow run created (a `prefect flow-run retry` reruns the same flow run). A run whose
    config.yaml cannot be read is skipped with a warning, so that one damaged run does not stop every new one."""
    for name in list_runs(root):
        try:
            cfg = read_run_config(Path(root) / name)
        except RunConfigError as e:
            log.warning("skipping run %r: %s", name, e)
            continue
        if cfg.get("flow_run_id") == flow_run_id:
            return Path(root) / name
    return None


def list_runs(root: str | Path) -> list[str]:
    root = Path(root)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / "config.yaml").exists()]
    return [p.name for p in sorted(runs, key=lambda p: (p / "config.yaml").stat().st_mtime)]


def remove_temporaries(run_dir: str | Path) -> int:
    """Delete what a killed writer left half-written (`.tmp-*` files and folders); call under the lock."""
    n = 0
    for p in sorted(Path(run_dir).rglob(".tmp-*"), reverse=True):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        n += 1
    return n


@contextmanager
def run_lock(run_dir: str | Path):
    """Hold an exclusive lock on the run while writing; a second writer fails at once with a clear message."""
    path = Path(run_dir) / ".lock"
    fh = open(path, "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise RunLockedError(
            f"run {Path(run_dir).name!r} is being written by another process "
            f"(lock {path}); wait for it to finish or stop it first"
        ) from None
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


def is_locked(run_dir: str | Path) -> bool:
    """Whether a process holds the run's lock now (it is being trained or evaluated)."""
    path = Path(run_dir) / ".lock"
    if not path.exists():
        return False
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return False
