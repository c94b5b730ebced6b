"""Run agent-written Python in a separate, resource-limited process with its own work directory.

Always: wall clock (the process group is killed), CPU seconds, address space, file size, process
count and captured output size; a scrubbed environment (no tokens or keys are inherited); a fresh
work directory, removed afterwards; a budget of its own per call (infra/sandbox_slots.py: a dedicated
uid when the trainer is root, so the code can neither signal the trainer, read its files nor use up
another call's process quota; a cgroup with process and memory limits where the host allows one).

A call that fails to start (bubblewrap cannot create its namespaces, the process cannot be spawned,
the interpreter is missing) is an infrastructure fault, not the program's: it is retried with backoff
(`start_retries`), and if it persists the result carries `infra_error` and the agents are told the
program never ran.

With bubblewrap (`isolation: bwrap`, or `auto` where `bwrap` works) the code also gets its own PID,
network, IPC and UTS namespaces: no network, the whole filesystem read-only except the work
directory, an empty /tmp, and every process it started dies with the sandbox (even one that left
the process group). `rlimits` (or `auto` without bubblewrap) lacks the first three; the fourth holds
there too when the call has a uid or cgroup of its own (every process of it is killed).

This module is what callers import (`run_python`, `preflight`, `sandbox_fault` and the `SandboxConfig` they
declare): it decides once per process how this host isolates calls (the bubblewrap and interpreter probes)
and retries calls that failed to start. The settings and result types are in infra/sandbox_types.py, the
launch of one call in infra/sandbox_process.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

from infra import sandbox_slots
from infra.errors import TeamrlError
from infra.retry import infra_record
from infra.sandbox_process import run_in_slot
from infra.sandbox_types import SandboxConfig, SandboxResult

log = logging.getLogger(__name__)


def sandbox_fault(r: SandboxResult | None) -> str | None:
    """An action's `infra_error` for a call that never ran (None when it ran, or no code was given)."""
    return infra_record("sandbox", r.infra_error) if r is not None and r.infra_error else None


class SandboxUnavailable(TeamrlError, RuntimeError):
    """Strict isolation was configured but bubblewrap cannot run here."""

    resumable = True


def _slot(cfg: SandboxConfig):
    return sandbox_slots.slot(cfg.uid_base, cfg.uid_count, cfg.max_processes, cfg.call_memory_mb)


def _host(cfg: SandboxConfig) -> tuple:
    """The fields the probes below depend on (hashable: each probe runs once per process)."""
    return cfg.python, cfg.uid_base, cfg.uid_count


@functools.cache
def bwrap_problem(
    python: str | None = None, uid_base: int = SandboxConfig().uid_base, uid_count: int = SandboxConfig().uid_count
) -> str | None:
    """None when bubblewrap works here, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    cfg = SandboxConfig(python=python, uid_base=uid_base, uid_count=uid_count, start_retries=0)
    r = _run_in("pass", cfg, None, bwrap=True)
    if r.infra_error or not r.ok:
        return f"bwrap cannot create its namespaces here: {r.infra_error or r.stderr.strip() or r.returncode}"
    return None


@functools.cache
def interpreter(
    python: str | None = None, uid_base: int = SandboxConfig().uid_base, uid_count: int = SandboxConfig().uid_count
) -> str:
    """The first of `python`, our interpreter, the system python3 that a sandbox uid can run."""
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0:
        return python or own
    candidates = [python] if python else [own, "/usr/bin/python3", "/usr/local/bin/python3"]
    with sandbox_slots.slot(uid_base, uid_count, 8, 256) as slot:
        for exe in candidates:
            try:
                r = subprocess.run(
                    [exe, "-I", "-S", "-c", "pass"],
                    capture_output=True,
                    timeout=30,
                    cwd="/",
                    user=slot.uid,
                    group=slot.uid,
                    extra_groups=[],
                )
            except OSError:
                continue
            if r.returncode == 0:
                return exe
    raise SandboxUnavailable(
        f"no Python interpreter that the sandbox uids ({uid_base}..) may run among {candidates} "
        "(a root-only install, e.g. under /root, is not readable by them): install python3 "
        "from the system packages or set sandbox.python"
    )


def use_bwrap(cfg: SandboxConfig) -> bool:
    """Whether `cfg` runs code under bubblewrap; raises SandboxUnavailable if it must and cannot."""
    if cfg.isolation == "rlimits":
        return False
    problem = bwrap_problem(*_host(cfg))
    if problem and cfg.isolation == "bwrap":
        raise SandboxUnavailable(
            f"sandbox.isolation=bwrap but {problem}; install it or set "
            "sandbox.isolation=rlimits (weaker: no network or filesystem isolation)"
        )
    if problem:
        _warn_once(problem)
    return problem is None


def preflight(cfg: SandboxConfig) -> None:
    """Fail now, not mid-rollout, if strict isolation cannot run here; say once if calls share a quota."""
    use_bwrap(cfg)
    sandbox_slots.warn_if_shared()


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning("agent code runs with resource limits only (no network/filesystem isolation): %s", problem)


def run_python(code: str, cfg: SandboxConfig | None = None, workdir: str | None = None) -> SandboxResult:
    """Execute `code` with the interpreter in isolated mode, in a fresh temporary directory, or in
    `workdir` (kept afterwards, shared by calls: a team's workspace) when given. A call that fails to
    start is retried (the program never ran, so the workspace is as it was)."""
    cfg = cfg or SandboxConfig()
    bwrap = use_bwrap(cfg)
    for attempt in range(cfg.start_retries + 1):
        r = _run_in(code, cfg, workdir, bwrap)
        if r.infra_error is None:
            return r
        log.warning(
            "sandbox call failed to start (attempt %d of %d): %s", attempt + 1, cfg.start_retries + 1, r.infra_error
        )
        if attempt < cfg.start_retries:
            time.sleep(cfg.retry_backoff_s * 2**attempt)
    return r


def _run_in(code: str, cfg: SandboxConfig, workdir: str | None, bwrap: bool) -> SandboxResult:
    with contextlib.ExitStack() as stack:
        work = os.path.abspath(workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="teamrl-sbx-")))
        python = interpreter(*_host(cfg))  # before taking a slot: the first lookup takes one of its own
        try:
            slot = stack.enter_context(_slot(cfg))
        except (OSError, sandbox_slots.NoFreeSlot) as e:
            return SandboxResult("", "", None, False, work, infra_error=f"no sandbox slot: {e}")
        return run_in_slot(code, cfg, work, bwrap, slot, python)
