"""One sandbox call in the slot it was given: the command line (bubblewrap, the limits shim, the prelude
that reports the start), the spawn in a session of its own, the wait, the kill of the whole process group
and the read-back of its output and of whether the program ever started. It is separate from
infra/sandbox.py, which decides how calls are isolated and retries those that failed to start: this is
where a call's processes, file descriptors and work-dir ownership are handled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from infra import sandbox_slots
from infra.sandbox_types import SandboxConfig, SandboxResult


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


def _read_capped(f, cap: int) -> str:
    f.seek(0)
    data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", errors="replace")
    return text + ("\n[output truncated]" if len(data) > cap else "")


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


def run_in_slot(
    code: str, cfg: SandboxConfig, work: str, bwrap: bool, slot: sandbox_slots.Slot, python: str
) -> SandboxResult:
    """Run `code` in `work` as `slot` with `python`; the result carries `infra_error` if it never started."""
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
            out_text = _read_capped(out, cfg.max_output_bytes)
            return SandboxResult(out_text, stderr, rc, timed_out, work, memory_killed=slot.memory_killed())
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
