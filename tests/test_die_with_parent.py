"""infra/die_with_parent.py: a command ends when the process that started it dies, however it dies; with
--kill even a command that handles SIGTERM (a server draining its requests) ends at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[1] / "infra" / "die_with_parent.py"
# the child: ignores SIGTERM, as a server that first drains its requests would seem to, and prints its pid
CHILD = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(60)"
)
# the parent: starts the child through the launcher and waits
PARENT = (
    "import os, subprocess, sys; "
    "launcher = [sys.executable, '-I', sys.argv[1], str(os.getpid()), *sys.argv[2:-1]]; "
    "subprocess.run([*launcher, sys.executable, '-c', sys.argv[-1]])"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("flags, ends", [(["--kill"], True), ([], False)])
def test_the_command_ends_with_its_parent(flags, ends):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(LAUNCHER), *flags, CHILD], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + (10 if ends else 2)  # a survivor is given 2 s to show it survives
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) != ends
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
