"""Run agent-written Python in a separate, resource-limited process with its own work directory.

Always: wall clock (the process group is killed), CPU seconds, address space, file size, process
count and captured output size; a scrubbed environment (no tokens or keys are inherited); a fresh
work directory, removed afterwards; when the trainer runs as root, the code runs as an unprivileged
user (`run_as_uid`), so it can neither signal the trainer nor read its files.

With bubblewrap (`isolation: bwrap`, or `auto` where `bwrap` works) the code also gets its own PID,
network, IPC and UTS namespaces: no network, the whole filesystem read-only except the work
directory, an empty /tmp, and every process it started dies with the sandbox (even one that left
the process group). `rlimits` (or `auto` without bubblewrap) lacks those four guarantees.
"""
from __future__ import annotations

import functools
import logging
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class SandboxConfig(BaseModel):
    """Limits for one execution of agent code."""

    model_config = ConfigDict(extra="forbid")

    isolation: Literal["auto", "bwrap", "rlimits"] = Field(
        "auto", description="`bwrap`: bubblewrap namespaces required (an error if unusable); `rlimits`: "
        "resource limits only; `auto`: bwrap where usable, else rlimits with a warning")
    timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit; the whole process group is killed")
    cpu_s: int = Field(5, ge=1, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address-space limit (RLIMIT_AS)")
    max_output_bytes: int = Field(4096, ge=64, description="stdout/stderr kept per stream; the rest is dropped")
    max_file_mb: int = Field(8, ge=1, description="largest file or output stream the code may write (RLIMIT_FSIZE)")
    max_processes: int = Field(64, ge=1, description="process limit (RLIMIT_NPROC) for the sandbox user")
    run_as_uid: int = Field(65534, ge=1, description="uid (and gid) the code runs as when the trainer is root "
                            "(65534 = nobody)")
    python: str | None = Field(None, description="interpreter for agent code; default: this process's, or the "
                               "system python3 when the sandbox user cannot run it")
    site_packages: bool = Field(False, description="let agent code import the interpreter's installed packages "
                                "(numpy, pandas, scikit-learn for data-science teams); off: the standard library only")


class SandboxUnavailable(RuntimeError):
    """Strict isolation was configured but bubblewrap cannot run here."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    workdir: str  # where the code ran (removed afterwards unless run_python was given it)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def feedback(self) -> str:
        """What the agents and the coach see."""
        if self.timed_out:
            return "TIMEOUT: the program did not finish in time"
        if self.returncode is not None and self.returncode < 0:
            return f"ERROR: killed by {signal.Signals(-self.returncode).name}"
        if self.returncode != 0:
            last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.returncode}"]
            return f"ERROR: {last[0]}"
        return self.stdout.strip() or "(no output)"


def _bwrap_argv(workdir: str) -> list[str]:
    """Read-only root, writable work dir, empty /tmp, fresh /proc and /dev, every namespace unshared
    (no network); --die-with-parent + the PID namespace take every descendant down with the sandbox."""
    return [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", workdir, workdir, "--chdir", workdir, "--unshare-all", "--die-with-parent",
            "--new-session", "--"]


def _no_prefix(workdir: str) -> list[str]:
    return []


def _drop_to(cfg: SandboxConfig) -> dict:
    """Popen arguments that switch to the unprivileged user when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": cfg.run_as_uid, "group": cfg.run_as_uid, "extra_groups": []}


def _user_processes() -> int:
    """Processes of our real uid now (RLIMIT_NPROC counts all of them, not only the sandbox's)."""
    uid, n = str(os.getuid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                n += any(line.startswith("Uid:") and line.split()[1] == uid for line in fh)
        except OSError:
            pass
    return n


# Sets the rlimits given as NAME=soft:hard, then execs the command after `--`. A fresh interpreter does
# this, not preexec_fn: running Python between fork and exec can deadlock a multi-threaded trainer.
_LIMITS_SHIM = """import os, resource, sys
i = sys.argv.index("--")
for spec in sys.argv[1:i]:
    name, soft, hard = spec.replace("=", ":").split(":")
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
os.execv(sys.argv[i + 1], sys.argv[i + 1:])
"""


def _with_limits(cfg: SandboxConfig, argv: list[str]) -> list[str]:
    # as root the code runs as run_as_uid, whose count starts near 0; otherwise add our own processes
    nproc = cfg.max_processes + (0 if os.geteuid() == 0 else _user_processes())
    mem, fsz = cfg.memory_mb * 1024 * 1024, cfg.max_file_mb * 1024 * 1024
    limits = {"CPU": (cfg.cpu_s, cfg.cpu_s + 1),  # SIGXCPU at the soft limit (a timeout), SIGKILL 1 s later
              "AS": (mem, mem), "FSIZE": (fsz, fsz), "CORE": (0, 0), "NPROC": (nproc, nproc)}
    return [interpreter(cfg.python, cfg.run_as_uid), "-I", "-S", "-c", _LIMITS_SHIM,
            *(f"{k}={a}:{b}" for k, (a, b) in limits.items()), "--", *argv]


@functools.cache
def bwrap_problem(run_as_uid: int = 65534) -> str | None:
    """None when bubblewrap works here, else why not (checked once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="teamrl-sbx-probe-") as d:
        if os.geteuid() == 0:
            os.chown(d, run_as_uid, run_as_uid)
        r = subprocess.run(_bwrap_argv(d) + ["/bin/true"], capture_output=True, text=True, timeout=30,
                           **_drop_to(SandboxConfig(run_as_uid=run_as_uid)))
    if r.returncode != 0:
        return f"bwrap cannot create its namespaces here: {r.stderr.strip() or f'exit code {r.returncode}'}"
    return None


@functools.cache
def interpreter(python: str | None = None, run_as_uid: int = 65534) -> str:
    """The first of `python`, our interpreter, the system python3 that the sandbox user can run."""
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0:
        return python or own
    candidates = [python] if python else [own, "/usr/bin/python3", "/usr/local/bin/python3"]
    for exe in candidates:
        try:
            r = subprocess.run([exe, "-I", "-S", "-c", "pass"], capture_output=True, timeout=30, cwd="/",
                               **_drop_to(SandboxConfig(run_as_uid=run_as_uid)))
        except OSError:
            continue
        if r.returncode == 0:
            return exe
    raise SandboxUnavailable(f"no Python interpreter that uid {run_as_uid} may run among {candidates} (a root-only "
                             "install, e.g. under /root, is not readable by it): install python3 from the "
                             "system packages or set sandbox.python")


def use_bwrap(cfg: SandboxConfig) -> bool:
    """Whether `cfg` runs code under bubblewrap; raises SandboxUnavailable if it must and cannot."""
    if cfg.isolation == "rlimits":
        return False
    problem = bwrap_problem(cfg.run_as_uid)
    if problem and cfg.isolation == "bwrap":
        raise SandboxUnavailable(f"sandbox.isolation=bwrap but {problem}; install it or set "
                                 "sandbox.isolation=rlimits (weaker: no network or filesystem isolation)")
    if problem:
        _warn_once(problem)
    return problem is None


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning("agent code runs with resource limits only (no network/filesystem isolation): %s", problem)


def _read_capped(f, cap: int) -> str:
    f.seek(0)
    data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", errors="replace")
    return text + ("\n[output truncated]" if len(data) > cap else "")


def run_python(code: str, cfg: SandboxConfig | None = None, workdir: str | None = None) -> SandboxResult:
    """Execute `code` with the interpreter in isolated mode, in a fresh temporary directory, or in
    `workdir` (kept afterwards, shared by calls: a team's workspace) when given."""
    cfg = cfg or SandboxConfig()
    with contextlib.ExitStack() as stack:
        work = workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="teamrl-sbx-"))
        return _run_in(code, cfg, os.path.abspath(work))


def _run_in(code: str, cfg: SandboxConfig, work: str) -> SandboxResult:
    prefix = _bwrap_argv if use_bwrap(cfg) else _no_prefix
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    drop = _drop_to(cfg)
    if drop:
        for parent in Path(work).parents:  # the sandbox user must be able to walk down to it
            st = os.stat(parent)
            if not st.st_mode & 0o001 and st.st_uid != cfg.run_as_uid:
                raise ValueError(f"work dir {work}: the sandbox user (uid {cfg.run_as_uid}) cannot enter {parent}; "
                                 f"create team workspaces under a world-searchable directory such as "
                                 f"{tempfile.gettempdir()}")
        os.chown(work, cfg.run_as_uid, cfg.run_as_uid)
    env["HOME"] = env["TMPDIR"] = work
    fd, script = tempfile.mkstemp(prefix=".teamrl-code-", suffix=".py", dir=work)
    with os.fdopen(fd, "w") as fh:
        fh.write(code)
    os.chmod(script, 0o644)
    try:
        # Output goes to unlinked files outside the work dir (bounded by RLIMIT_FSIZE), never to pipes
        # that could fill and block.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            site = [] if cfg.site_packages else ["-S"]
            argv = prefix(work) + [interpreter(cfg.python, cfg.run_as_uid), "-I", *site, script]
            proc = subprocess.Popen(_with_limits(cfg, argv), cwd=work, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True, close_fds=True, **drop)
            timed_out = False
            try:
                rc = proc.wait(timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, rc = True, None
            finally:
                try:  # kill the whole group, including children that outlive the call
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            if prefix is _bwrap_argv and rc is not None and rc > 128:  # bwrap reports a signal n as 128 + n
                rc = 128 - rc
            if rc is not None and rc < 0 and -rc == signal.SIGXCPU:
                timed_out = True
            return SandboxResult(_read_capped(out, cfg.max_output_bytes), _read_capped(err, cfg.max_output_bytes),
                                 rc, timed_out, work)
    finally:
        with contextlib.suppress(FileNotFoundError):  # the code may have removed it
            os.unlink(script)
