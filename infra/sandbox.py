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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra import sandbox_slots
from infra.errors import TeamrlError
from infra.retry import infra_record

log = logging.getLogger(__name__)


class SandboxConfig(BaseModel):
    """Limits for one execution of agent code."""

    model_config = ConfigDict(extra="forbid")

    isolation: Literal["auto", "bwrap", "rlimits"] = Field(
        "auto",
        description="`bwrap`: bubblewrap namespaces required (an error if unusable); `rlimits`: "
        "resource limits only; `auto`: bwrap where usable, else rlimits with a warning",
    )
    timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit; the whole process group is killed")
    cpu_s: int = Field(5, ge=1, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address-space limit (RLIMIT_AS)")
    max_output_bytes: int = Field(4096, ge=64, description="stdout/stderr kept per stream; the rest is dropped")
    max_file_mb: int = Field(8, ge=1, description="largest file or output stream the code may write (RLIMIT_FSIZE)")
    max_processes: int = Field(
        64, ge=1, description="processes one call may run at once (RLIMIT_NPROC of its uid, and pids.max of its cgroup)"
    )
    call_memory_mb: int = Field(
        2048,
        ge=64,
        description="memory of all the call's processes together (its "
        "cgroup's limit, where the host allows per-call cgroups)",
    )
    uid_base: int = Field(
        2_147_000_000,
        ge=1,
        le=2**31 - 2**16 - 2,
        description="first uid of the pool the calls run as "
        "when the trainer is root (one uid per concurrent call on the host; uid = gid); pick a "
        "range no account or subuid map uses",
    )
    uid_count: int = Field(
        64,
        ge=1,
        le=65536,
        description="uids in the pool: the most calls that run at once on the host (more wait for a free uid)",
    )
    start_retries: int = Field(
        3,
        ge=0,
        le=10,
        description="retries of a call that failed to start (an "
        "infrastructure fault), with exponential backoff from `retry_backoff_s`",
    )
    retry_backoff_s: float = Field(0.5, ge=0, le=60, description="first retry's delay; doubled each retry")
    python: str | None = Field(
        None,
        description="interpreter for agent code; default: this process's, or the "
        "system python3 when the sandbox user cannot run it",
    )
    site_packages: bool = Field(
        False,
        description="let agent code import the interpreter's installed packages "
        "(numpy, pandas, scikit-learn for data-science teams); off: the standard library only",
    )


# starts the feedback of a program that never ran: told apart from the program's own errors
INFRA_PREFIX = "NOT RUN (infrastructure fault, not the program's):"


def sandbox_fault(r: SandboxResult | None) -> str | None:
    """An action's `infra_error` for a call that never ran (None when it ran, or no code was given)."""
    return infra_record("sandbox", r.infra_error) if r is not None and r.infra_error else None


class SandboxUnavailable(TeamrlError, RuntimeError):
    """Strict isolation was configured but bubblewrap cannot run here."""

    resumable = True


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    workdir: str  # where the code ran (removed afterwards unless run_python was given it)
    infra_error: str | None = None  # why the program never ran (the sandbox failed to start it), after retries

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.infra_error is None

    def feedback(self) -> str:
        """What the agents and the coach see."""
        if self.infra_error:
            return f"{INFRA_PREFIX} the sandbox could not start the program, which did not run ({self.infra_error})"
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
    return [
        shutil.which("bwrap") or "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--bind",
        workdir,
        workdir,
        "--chdir",
        workdir,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--",
    ]


# The interpreter's first act: say on the status fd that the program is starting (and close the fd), then
# run the script as __main__. No word on the fd means the sandbox never started the program: bwrap could
# not fork or create its namespaces, or the shim failed.
_STARTED = "started"
_PRELUDE = f"""import os, sys
os.write(int(sys.argv[1]), b"{_STARTED}")
os.close(int(sys.argv[1]))
sys.argv = sys.argv[2:]
with open(sys.argv[0]) as f:
    code = compile(f.read(), sys.argv[0], "exec")
del f
exec(code, {{"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__}})
"""


def _user_processes() -> int:
    """Processes of our real uid now (RLIMIT_NPROC counts all of them, not only the sandbox's)."""
    return len(sandbox_slots.processes_of(os.getuid()))


# Joins the call's cgroups, sets the rlimits given as NAME=soft:hard, drops to the slot's uid, then execs
# the command after `--`. A fresh interpreter does this, not preexec_fn: running Python between fork and
# exec can deadlock a multi-threaded trainer. Any failure before the exec is reported on the status fd.
_LIMITS_SHIM = """import os, resource, sys
i = sys.argv.index("--")
status, uid = int(sys.argv[1]), None
try:
    for spec in sys.argv[2:i]:
        name, value = spec.split("=", 1)
        if name == "CGROUP":
            with open(value + "/cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))
        elif name == "UID":
            uid = int(value)
        else:
            soft, hard = value.split(":")
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.execv(sys.argv[i + 1], sys.argv[i + 1:])
except BaseException as e:
    os.write(status, f"teamrl-shim: {type(e).__name__}: {e}".encode())
    os._exit(127)
"""


def _shim(cfg: SandboxConfig, slot: sandbox_slots.Slot, status_fd: int, argv: list[str]) -> list[str]:
    # as root the code runs as the slot's own uid, whose count starts at 0; otherwise add our own processes
    nproc = cfg.max_processes + (0 if slot.uid is not None else _user_processes())
    mem, fsz = cfg.memory_mb * 1024 * 1024, cfg.max_file_mb * 1024 * 1024
    limits = {
        "CPU": (cfg.cpu_s, cfg.cpu_s + 1),  # SIGXCPU at the soft limit (a timeout), SIGKILL 1 s later
        "AS": (mem, mem),
        "FSIZE": (fsz, fsz),
        "CORE": (0, 0),
        "NPROC": (nproc, nproc),
    }
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _LIMITS_SHIM,
        str(status_fd),
        *(f"CGROUP={g}" for g in slot.cgroups),
        *([f"UID={slot.uid}"] if slot.uid is not None else []),
        *(f"{k}={a}:{b}" for k, (a, b) in limits.items()),
        "--",
        *argv,
    ]


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


def _read_capped(f, cap: int) -> str:
    f.seek(0)
    data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", errors="replace")
    return text + ("\n[output truncated]" if len(data) > cap else "")


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
        return _run_in_slot(code, cfg, work, bwrap, slot, python)


def _give_to(work: str, uid: int) -> None:
    """Hand the work dir (and what earlier calls of a shared workspace left in it) to the slot's uid."""
    for parent in Path(work).parents:  # the sandbox user must be able to walk down to it
        st = os.stat(parent)
        if not st.st_mode & 0o001 and st.st_uid != uid:
            raise ValueError(
                f"work dir {work}: the sandbox users cannot enter {parent}; create team workspaces "
                f"under a world-searchable directory such as {tempfile.gettempdir()}"
            )
    for root, dirs, files in os.walk(work):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, uid)


def _run_in_slot(
    code: str, cfg: SandboxConfig, work: str, bwrap: bool, slot: sandbox_slots.Slot, python: str
) -> SandboxResult:
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }
    if slot.uid is not None:
        _give_to(work, slot.uid)
    env["HOME"] = env["TMPDIR"] = work
    fd, script = tempfile.mkstemp(prefix=".teamrl-code-", suffix=".py", dir=work)
    with os.fdopen(fd, "w") as fh:
        fh.write(code)
    os.chmod(script, 0o644)
    status_r, status_w = os.pipe()
    try:
        # Output goes to unlinked files outside the work dir (bounded by RLIMIT_FSIZE), never to pipes
        # that could fill and block.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            site = [] if cfg.site_packages else ["-S"]
            if not os.access(python, os.X_OK):  # removed or unmounted since the start-up check
                return SandboxResult("", "", None, False, work, infra_error=f"interpreter {python} is missing")
            argv = (_bwrap_argv(work) if bwrap else []) + [python, "-I", *site, "-c", _PRELUDE, str(status_w), script]
            try:
                proc = subprocess.Popen(
                    _shim(cfg, slot, status_w, argv),
                    cwd=work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(status_w,),
                )
            except OSError as e:  # EAGAIN / ENOMEM at fork, a missing interpreter
                return SandboxResult("", "", None, False, work, infra_error=f"spawn failed: {e}")
            os.close(status_w)
            status_w = -1
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
            stderr = _read_capped(err, cfg.max_output_bytes)
            if fault := _start_fault(_read_status(status_r), stderr, timed_out):
                return SandboxResult("", "", None, False, work, infra_error=fault)
            if bwrap and rc is not None and rc > 128:  # bwrap reports a signal n as 128 + n
                rc = 128 - rc
            if rc is not None and rc < 0 and -rc == signal.SIGXCPU:
                timed_out = True
            return SandboxResult(_read_capped(out, cfg.max_output_bytes), stderr, rc, timed_out, work)
    finally:
        for f in (status_r, status_w):
            if f >= 0:
                os.close(f)
        with contextlib.suppress(FileNotFoundError):  # the code may have removed it
            os.unlink(script)


def _read_status(fd: int) -> str:
    """What the shim and bwrap reported (written before the process ended; the program may hold the pipe)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 1 << 20:
                break
    return b"".join(chunks).decode("utf-8", errors="replace")


def _start_fault(status: str, stderr: str, timed_out: bool) -> str | None:
    """Why the program never started, or None when it did."""
    if "teamrl-shim:" in status:
        return status.split("teamrl-shim:", 1)[1].strip()[:500]
    if _STARTED not in status:
        last = stderr.strip().splitlines()[-1:] or ["the sandbox exited before starting the program"]
        return last[0][:500] + (" (timed out)" if timed_out else "")
    return None
