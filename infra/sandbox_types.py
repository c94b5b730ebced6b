"""The sandbox's settings (`SandboxConfig`, a pipeline config's `sandbox` section) and the outcome of one
call (`SandboxResult`, with the feedback the agents and the coach read). The entry point (infra/sandbox.py)
and the launch of a call (infra/sandbox_process.py) both need them; held here, they let the entry point
import the launch without an import cycle.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    workdir: str  # where the code ran (removed afterwards unless run_python was given it)
    infra_error: str | None = None  # why the program never ran (the sandbox failed to start it), after retries
    memory_killed: bool = False  # the kernel killed a process of the call for going over `call_memory_mb`

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.infra_error is None

    def feedback(self) -> str:
        """What the agents and the coach see."""
        if self.infra_error:
            return f"{INFRA_PREFIX} the sandbox could not start the program, which did not run ({self.infra_error})"
        if self.timed_out:
            return "TIMEOUT: the program did not finish in time"
        if self.memory_killed and self.returncode != 0:
            return "ERROR: out of memory (the program and its child processes went over their memory limit)"
        if self.returncode is not None and self.returncode < 0:
            return f"ERROR: killed by {signal.Signals(-self.returncode).name}"
        if self.returncode != 0:
            last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.returncode}"]
            return f"ERROR: {last[0]}"
        return self.stdout.strip() or "(no output)"
