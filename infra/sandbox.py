"""Run agent-written Python in a separate, resource-limited process with its own work directory.

Limits: wall clock (the process group is killed), CPU seconds, address space, file size, process
count and captured output size; the environment is scrubbed (no tokens or keys are inherited).
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class SandboxConfig(BaseModel):
    """Limits for one execution of agent code."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit; the whole process group is killed")
    cpu_s: int = Field(5, ge=1, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address-space limit (RLIMIT_AS)")
    max_output_bytes: int = Field(4096, ge=64, description="stdout/stderr kept per stream; the rest is dropped")
    max_file_mb: int = Field(8, ge=1, description="largest file the code may write (RLIMIT_FSIZE)")
    max_processes: int = Field(64, ge=1, description="process limit (RLIMIT_NPROC) for the sandbox user")


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def feedback(self) -> str:
        """What the agents and the coach see."""
        if self.timed_out:
            return "TIMEOUT: the program did not finish in time"
        if self.returncode != 0:
            last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.returncode}"]
            return f"ERROR: {last[0]}"
        return self.stdout.strip() or "(no output)"


def _limits(cfg: SandboxConfig):
    def apply():
        os.setsid()
        # SIGXCPU at the soft limit (reported as a timeout); SIGKILL one second later if it is ignored
        resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_s, cfg.cpu_s + 1))
        mem = cfg.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fsz = cfg.max_file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsz, fsz))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.geteuid() != 0:  # RLIMIT_NPROC does not bind root
            resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_processes, cfg.max_processes))
    return apply


def _read_capped(f, cap: int) -> str:
    f.seek(0)
    data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", errors="replace")
    return text + ("\n[output truncated]" if len(data) > cap else "")


def run_python(code: str, cfg: SandboxConfig | None = None) -> SandboxResult:
    """Execute `code` with the interpreter in isolated mode, in a fresh temporary directory."""
    cfg = cfg or SandboxConfig()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="teamrl-sbx-") as work:
        env["HOME"] = env["TMPDIR"] = work
        script = os.path.join(work, "main.py")
        with open(script, "w") as fh:
            fh.write(code)
        # Output goes to files (bounded by RLIMIT_FSIZE), never to pipes that could fill and block.
        with open(os.path.join(work, ".out"), "w+b") as out, open(os.path.join(work, ".err"), "w+b") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", script], cwd=work, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    preexec_fn=_limits(cfg), close_fds=True)
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
            if rc is not None and rc < 0 and -rc == signal.SIGXCPU:
                timed_out = True
            return SandboxResult(_read_capped(out, cfg.max_output_bytes), _read_capped(err, cfg.max_output_bytes),
                                 rc, timed_out)
