"""Ctrl-C for a long command: the first stops it cleanly within a grace period, a second stops it at once.

The first SIGINT raises KeyboardInterrupt in the main thread, as Python's default handler does, so the code
unwinds: Prefect records the flow run as Crashed, the run lock is released, the MLflow run is marked KILLED.
A watchdog ends the process if that, exit handlers included, takes longer than the grace period from the
signal. The thread that counts the presses (below) starts it as the signal arrives: Python's handler runs
only once the main thread leaves the C call it is in, which can outlast the grace period itself (an SQLite
busy wait on an MLflow store that another process is writing: up to 20 s). A KeyboardInterrupt raised where
Python cannot raise (a weakref or garbage-collector callback, a __del__: "Exception ignored in ...") is
raised again.

A second SIGINT ends the process at once: the signal's default action, which needs neither the main thread
nor the GIL to be free. Python runs its signal handlers in the main thread between bytecodes, so two SIGINTs
that arrive while the main thread is in C code (an fsync, a long tensor op) make one handler call; a thread
counts them from the signal module's wakeup file descriptor instead. That descriptor is a Unix socket that
reports each byte's sender: a child forked but not yet exec'd (subprocess forks instead of vforks when it
changes the user, as the sandbox's interpreter probe does) shares it and Python's handler, so one Ctrl-C to
the process group can write two bytes, and only this process's own count.

Either way the process ends killed by SIGINT, as Python ends on an uncaught KeyboardInterrupt. A shell shows
status 130, and a shell script that runs the command stops too; an ordinary exit status would tell the shell
that the command handled the Ctrl-C itself, and the script would go on to its next command.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from functools import partial
from typing import cast

STOP_S = 10.0  # the most a stopping run may take, from the first Ctrl-C to the process's exit
# the watchdog fires this much before STOP_S: after its SIGINT the process still has to end
EXIT_MARGIN_S = 0.5
GRACE_S = STOP_S - EXIT_MARGIN_S

_interrupted = False


@contextmanager
def stop_on_ctrl_c(grace_s: float = GRACE_S):
    """The block with the Ctrl-C behaviour above; its caller catches the KeyboardInterrupt and returns or
    exits, and the process then ends killed by SIGINT once the exit handlers have run. Does nothing off the
    main thread, or where SIGINT is ignored (a background job of a shell script) or handled by someone else."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    # registered before the exit handlers of what the block starts (Prefect's temporary server), so it runs after them
    atexit.register(_end_interrupted)
    unraisablehook = sys.unraisablehook
    sys.unraisablehook = partial(_on_unraisable, unraisablehook)
    counted = _count_ctrl_c(grace_s)
    signal.signal(signal.SIGINT, partial(_on_first, grace_s, counted is None))
    try:
        yield
    finally:
        if not _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = unraisablehook
            atexit.unregister(_end_interrupted)
            if counted:
                signal.set_wakeup_fd(-1)
                counted.close()  # the counting thread reads the end of its socket and returns


def by_ctrl_c(e: BaseException | None) -> bool:
    """Whether `e` is a KeyboardInterrupt or was raised while handling one: a Ctrl-C can surface as another
    error (Prefect's task engine raises ValueError("Task run is not set") when it lands while a task run is
    being created)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _on_first(grace_s: float, watchdog: bool, signum, frame) -> None:
    """Python's handler of the first SIGINT; it starts the watchdog (`watchdog`) where no thread counts."""
    global _interrupted
    _interrupted = True
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once
    if watchdog:
        _start_watchdog(grace_s)
    os.write(2, b"\nstopping: the current stage is abandoned (Ctrl-C again to quit at once)\n")
    raise KeyboardInterrupt


def _count_ctrl_c(grace_s: float) -> socket.socket | None:
    """Start the thread that starts the watchdog at the first SIGINT to this process and ends the process
    at the second; returns the writing end of its socket (None where the wakeup file descriptor is taken,
    by an asyncio loop of the main thread: then two SIGINTs that arrive together count as one, and the
    grace period starts once the main thread runs Python's handler)."""
    r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per byte; EOF once w closes
    r.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # each message carries its sender's pid
    w.setblocking(False)
    if signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False) != -1:
        signal.set_wakeup_fd(-1)
        r.close()
        w.close()
        return None
    me = os.getpid()

    def count():
        n = 0
        while True:
            data, ancillary, _, _ = r.recvmsg(64, socket.CMSG_SPACE(struct.calcsize("3i")))
            if not data:
                break
            if (k := data.count(signal.SIGINT)) and _sender(ancillary) == me:
                n += k
                if n >= 2:
                    _die_by_sigint()
                else:  # the first: its grace period starts now, however long the main thread stays in C code
                    _start_watchdog(grace_s)
        r.close()

    threading.Thread(target=count, name="ctrl-c", daemon=True).start()
    return w


def _start_watchdog(grace_s: float) -> None:
    watchdog = threading.Timer(grace_s, _die_by_sigint)
    watchdog.daemon = True
    watchdog.start()


def _sender(ancillary: list) -> int | None:
    """The pid in a message's SCM_CREDENTIALS (struct ucred: pid, uid, gid)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("3i", data[: struct.calcsize("3i")])[0]
    return None


def _on_unraisable(hook, unraisable) -> None:
    """A lost Ctrl-C is raised in the main thread again: by another thread, so that it lands after the
    callback that lost it."""
    if _interrupted and isinstance(unraisable.exc_value, KeyboardInterrupt):
        threading.Thread(target=_raise_in_main_thread, daemon=True).start()
    else:
        hook(unraisable)


def _raise_in_main_thread() -> None:
    """KeyboardInterrupt in the main thread once it has left the hook (raised in the hook, it would be lost
    for good; raised in another such callback, it comes back to the hook)."""
    import ctypes

    main = cast(int, threading.main_thread().ident)  # started: it is the thread that set the hook
    while _inside(sys._current_frames().get(main), _on_unraisable.__code__):
        time.sleep(0.001)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(KeyboardInterrupt))


def _inside(frame, code) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _end_interrupted() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    _die_by_sigint()


def _die_by_sigint() -> None:
    """From any thread: the C library's signal(), as Python's signal.signal works in the main thread only."""
    import ctypes

    ctypes.CDLL(None).signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
