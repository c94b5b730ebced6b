"""`python -I die_with_parent.py PARENT_PID [--kill] COMMAND...`: become COMMAND, which the kernel sends SIGTERM
(SIGKILL with --kill: for a server whose graceful shutdown would first finish every request in flight) when
the parent process dies, however it dies (Linux's parent-death signal; elsewhere COMMAND outlives a killed
parent). Run by path in isolated mode, before any package is imported: it needs only the standard library,
and a folder named like one of teamrl's packages in the working directory cannot stand in for it."""

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(parent: int, command: list[str]) -> None:
    sig = signal.SIGTERM
    if command[:1] == ["--kill"]:
        sig, command = signal.SIGKILL, command[1:]
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the signal was armed
            sys.exit(0)
    os.execv(command[0], command)  # the parent-death signal survives exec


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
