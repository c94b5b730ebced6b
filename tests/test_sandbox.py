"""The code sandbox (infra/sandbox.py): limits, isolation and clean-up."""
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from infra.sandbox import SandboxConfig, run_python

SPAWN = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session={new_session})
print(p.pid)
"""


def alive(pid: int) -> bool:
    """Running (a killed child may linger as an unreaped zombie when PID 1 does not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_normal_output():
    r = run_python("print(6 * 7)")
    assert r.ok and r.stdout == "42\n" and r.feedback() == "42"
    assert run_python("x = 1").feedback() == "(no output)"


def test_wall_clock_timeout():
    t0 = time.monotonic()
    r = run_python("import time\nwhile True: time.sleep(0.01)", SandboxConfig(timeout_s=1))
    assert time.monotonic() - t0 < 4
    assert r.timed_out and not r.ok and r.feedback().startswith("TIMEOUT")


def test_cpu_limit_reports_timeout():
    t0 = time.monotonic()
    r = run_python("while True: pass", SandboxConfig(cpu_s=1, timeout_s=20))
    assert time.monotonic() - t0 < 10  # stopped by the CPU limit, not the wall clock
    assert r.timed_out and r.feedback().startswith("TIMEOUT")


def test_exception_feedback():
    r = run_python("raise ValueError('boom')")
    assert not r.ok and r.returncode == 1
    assert r.feedback() == "ERROR: ValueError: boom"
    assert "Traceback" in r.stderr


@pytest.mark.parametrize("code", ["x = bytearray(4 * 10**9)",
                                  "x = []\nwhile True: x.append(bytearray(10**7))"])
def test_memory_bomb_fails_in_the_child_only(code):
    r = run_python(code, SandboxConfig(memory_mb=256, timeout_s=10))
    assert not r.ok and r.feedback() == "ERROR: MemoryError"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_huge_output_is_truncated(stream):
    r = run_python(f"import sys\nsys.{stream}.write('x' * 100000)", SandboxConfig(max_output_bytes=1000))
    text = getattr(r, stream)
    assert text == "x" * 1000 + "\n[output truncated]"


def test_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("TEAMRL_SECRET", "x")
    r = run_python("import os\nprint(os.environ.get('TEAMRL_SECRET'), sorted(os.environ))")
    assert r.stdout.startswith("None ")
    assert "TEAMRL_SECRET" not in r.stdout and "OPENAI_API_KEY" not in r.stdout


def test_child_processes_are_killed_after_the_call():
    r = run_python(SPAWN.format(new_session=False))
    pid = int(r.stdout)
    time.sleep(0.2)
    assert not alive(pid)


@pytest.mark.xfail(reason="known gap, issue 4 (bubblewrap / PID namespace): clean-up is os.killpg on the child's group only; a grandchild that starts its own "
                          "session (setsid / start_new_session) escapes and outlives the call", strict=True)
def test_child_in_a_new_session_is_killed_after_the_call():
    r = run_python(SPAWN.format(new_session=True))
    pid = int(r.stdout)
    try:
        time.sleep(0.2)
        assert not alive(pid)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_fresh_temporary_work_dir():
    code = ("import os\nprint(os.getcwd(), os.environ['HOME'])\nprint(sorted(os.listdir('.')))\n"
            "open('left.txt', 'w').write('x')")
    first, second = run_python(code), run_python(code)
    (cwd1, home1), files1 = first.stdout.splitlines()[0].split(), first.stdout.splitlines()[1]
    cwd2, files2 = second.stdout.splitlines()[0].split()[0], second.stdout.splitlines()[1]
    assert cwd1 != cwd2 and home1 == cwd1
    for cwd in (cwd1, cwd2):
        assert Path(cwd).parent == Path(tempfile.gettempdir()) and Path(cwd).name.startswith("teamrl-sbx-")
        assert not Path(cwd).exists()  # removed after the call
    assert "left.txt" not in files1 and "left.txt" not in files2  # nothing carried over
