"""The Ctrl-C handler (infra/interrupt.py) in small child interpreters, with no flow, server or run: a
Ctrl-C that surfaces as another error is still one, a Ctrl-C lost in a callback is raised again, two presses
while the main thread is in C code quit at once, and one press to a group with a forked child is one press.
Apart from test_interrupts.py, whose tests start the whole CLI on a run."""

import os
import signal
import subprocess
import sys
import time

import pytest
from test_interrupts import FOREGROUND, STOP_S
from test_resume_faults import REPO

pytestmark = pytest.mark.slow


def test_a_ctrl_c_that_surfaces_as_another_error_is_still_a_ctrl_c():
    from infra.interrupt import by_ctrl_c

    def raised(fn):
        try:
            fn()
        except BaseException as e:
            return e

    def crash_while_handling_a_ctrl_c():  # as Prefect's task engine does when a Ctrl-C lands in a task run's start
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("Task run is not set")  # noqa: B904 (the implicit context is the point)

    assert by_ctrl_c(raised(crash_while_handling_a_ctrl_c))
    assert by_ctrl_c(KeyboardInterrupt())
    assert not by_ctrl_c(raised(lambda: 1 / 0))


LOST_CTRL_C = """
import os, signal, time, weakref
from infra.interrupt import stop_on_ctrl_c

class Thing:
    pass

def lose_it(_):  # a weakref callback: Python prints a KeyboardInterrupt raised here and drops it
    os.kill(os.getpid(), signal.SIGINT)

t0 = time.monotonic()
try:
    with stop_on_ctrl_c(grace_s=60):
        thing = Thing()
        ref = weakref.ref(thing, lose_it)
        del thing
        while time.monotonic() - t0 < 30:  # the work goes on
            pass
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_ctrl_c_lost_in_a_callback_is_raised_again():
    """SQLAlchemy's weakref callbacks are where a Ctrl-C in the train flow was seen to get lost."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [*FOREGROUND, sys.executable, "-c", LOST_CTRL_C], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.stdout.strip() == "interrupted" and time.monotonic() - t0 < STOP_S, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGINT, proc.stderr


IN_C_CODE = """
import hashlib
from infra.interrupt import stop_on_ctrl_c

try:
    with stop_on_ctrl_c():
        print("in C code", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 100_000_000)  # half a minute in C: no Python handler runs
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def interrupted_in_c_code(code: str, presses: int = 1, group: bool = False) -> tuple[int, float, str, str]:
    """Run `code` in a child that prints "in C code" before its long C call, then SIGINT it `presses` times (to
    its process group with `group`): (exit status, seconds from the last press to its exit, stdout, stderr)."""
    proc = subprocess.Popen(
        [*FOREGROUND, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=group,
    )
    try:
        assert proc.stdout.readline().strip() == "in C code", proc.stderr.read()
        time.sleep(0.5)
        for _ in range(presses):
            os.killpg(proc.pid, signal.SIGINT) if group else os.kill(proc.pid, signal.SIGINT)
            time.sleep(0.1)
        t0 = time.monotonic()
        rc = proc.wait(timeout=300)
        took = time.monotonic() - t0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
        except ProcessLookupError:
            pass
    return rc, took, proc.stdout.read(), proc.stderr.read()


def test_two_ctrl_c_while_the_main_thread_is_in_c_code_quit_at_once():
    """Python would run its SIGINT handler once, when the C call returns: both presses would make one."""
    rc, took, out, err = interrupted_in_c_code(IN_C_CODE, presses=2)
    assert rc == -signal.SIGINT and took < 5 and "interrupted" not in out, (rc, took, out, err)


ONE_IN_C_CODE = """
import hashlib
from infra.interrupt import stop_on_ctrl_c

try:
    with stop_on_ctrl_c(grace_s=1):
        print("in C code", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 100_000_000)  # half a minute in C, as an SQLite busy wait
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_the_grace_period_starts_at_the_signal_not_when_the_main_thread_leaves_c_code():
    """Python's handler runs once the C call returns; the watchdog started there let a stop outlast the
    grace period by as long as the call took (27 s for a Ctrl-C in an SQLite busy wait). Ended by the
    watchdog in C code, the process never gets to print "interrupted"."""
    rc, _, out, err = interrupted_in_c_code(ONE_IN_C_CODE)
    assert rc == -signal.SIGINT and out == "", (rc, out, err)


HANGING_EXIT_HANDLER = """
import atexit, os, signal, time
from infra.interrupt import stop_on_ctrl_c

def flush():  # as MLflow's trace queue or Prefect's server stop would, were they to hang
    print("exit handler", flush=True)
    time.sleep(3600)

try:
    with stop_on_ctrl_c(grace_s=1):
        atexit.register(flush)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(3600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_exit_handlers_run_under_the_watchdog():
    """An exit handler of what the block started runs after the clean stop, and the grace period covers it."""
    proc = subprocess.run(
        [*FOREGROUND, sys.executable, "-c", HANGING_EXIT_HANDLER], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr
    assert proc.stdout.split() == ["interrupted", "exit", "handler"], proc.stdout + proc.stderr


FORKED_CHILD = """
import hashlib, os, time
from infra.interrupt import stop_on_ctrl_c

try:
    with stop_on_ctrl_c(grace_s=300):
        if os.fork() == 0:  # a child forked, not exec'd: it shares the wakeup socket and Python's handler
            try:
                time.sleep(120)
            finally:
                os._exit(0)
        print("in C code", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 10_000_000)  # seconds in C: the counting thread reads first
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_one_ctrl_c_to_a_group_with_a_forked_child_is_one_press():
    """The sandbox's interpreter probe forks (it changes the user); a Ctrl-C to the process group while it
    has not exec'd yet reached both processes' handlers, the counting thread read two SIGINTs and the
    process quit at once, without its clean stop."""
    rc, _, out, err = interrupted_in_c_code(FORKED_CHILD, group=True)
    assert rc == -signal.SIGINT and out.strip() == "interrupted", (rc, out, err)
