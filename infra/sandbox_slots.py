"""Per-call budgets for sandboxed code: each concurrent call holds a slot of its own, so one runaway
program cannot stop the other calls from starting.

Why: RLIMIT_NPROC counts every process of a uid. When all calls ran as one uid, a program forking until
it failed used the whole quota, and every other sandbox call on the host (other episodes, other runs)
failed to start until that call's timeout.

The mechanisms, chosen per host (`budgets()` says which):
- `uids` (the trainer runs as root): a pool of `uid_count` dedicated uids from `uid_base`. A call holds
  one uid through an exclusive lock file for its whole life, across processes and runs on the host.
  Every process of that uid is killed before the uid is handed on, so nothing a call left behind, even a
  process in a session of its own, counts against the next call.
- `cgroup` (cgroup v2 with the pids and memory controllers, or the v1 pids and memory hierarchies, where
  we may create groups): one group per call with `pids.max = max_processes` and a memory limit of
  `call_memory_mb` for all the call's processes together; removed after the call.
- neither (not root, no writable cgroups): every call shares this user's process quota. A runaway call
  can make other calls fail to start; those calls are retried and then recorded as infrastructure faults
  (never as the program's failure). A warning says so once per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import random
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_DIR = Path(tempfile.gettempdir()) / "teamrl-sandbox-slots"


class NoFreeSlot(RuntimeError):
    """Every uid of the pool stayed busy for the whole wait."""


@dataclass
class Slot:
    """What one call runs with: its uid (None: our own) and the cgroups its first process joins."""

    uid: int | None
    cgroups: list[Path] = field(default_factory=list)

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process of this call for going over the call's memory limit."""
        for d in self.cgroups:
            for name in ("memory.events", "memory.oom_control"):  # cgroup v2, v1: both have an `oom_kill N` line
                with contextlib.suppress(OSError):
                    fields = dict(line.split() for line in (d / name).read_text().splitlines() if line.strip())
                    if int(fields.get("oom_kill", 0)) > 0:
                        return True
        return False


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup mount."""
    out = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            _, point, fstype, opts, *_ = line.split()
            if fstype in ("cgroup", "cgroup2"):
                out.append((point, fstype, set(opts.split(","))))
    return out


@functools.cache
def cgroup_parents() -> tuple[tuple[str, Path], ...]:
    """(controller, parent folder of our per-call groups) for `pids` and `memory`, or () when this host
    does not let us create limited groups. Probed once: a group is made, limited and removed."""
    v1 = {c: Path(p) for p, t, o in _mounts() if t == "cgroup" for c in ("pids", "memory") if c in o}
    if "pids" in v1 and "memory" in v1:
        parents: tuple[tuple[str, Path], ...] = (
            ("pids", v1["pids"] / "teamrl-sandbox"),
            ("memory", v1["memory"] / "teamrl-sandbox"),
        )
    else:
        v2 = [Path(p) for p, t, _ in _mounts() if t == "cgroup2"]
        if not v2 or not {"pids", "memory"} <= set((v2[0] / "cgroup.controllers").read_text().split()):
            return ()
        parents = (("v2", v2[0] / "teamrl-sandbox"),)
    try:
        for kind, parent in parents:
            parent.mkdir(exist_ok=True)
            if kind == "v2":
                (parent / "cgroup.subtree_control").write_text("+pids +memory")
        probe = _make_groups(parents, 8, 64)
        _remove_groups(probe)
        for _, parent in parents:
            _sweep_orphans(parent)
    except OSError as e:
        log.debug("per-call cgroups unavailable: %s", e)
        return ()
    return parents


def _limits(kind: str, max_processes: int, memory_mb: int) -> dict[str, str]:
    mem = str(memory_mb * 1024 * 1024)
    return {
        "pids": {"pids.max": str(max_processes)},
        "memory": {"memory.limit_in_bytes": mem},
        "v2": {"pids.max": str(max_processes), "memory.max": mem, "memory.swap.max": "0"},
    }[kind]


def _make_groups(parents, max_processes: int, memory_mb: int) -> list[Path]:
    name, made = f"call-{os.getpid()}-{uuid.uuid4().hex[:8]}", []
    try:
        for kind, parent in parents:
            d = parent / name
            d.mkdir()
            made.append(d)
            for f, v in _limits(kind, max_processes, memory_mb).items():
                if f == "memory.swap.max" and not (d / f).exists():
                    continue  # no swap accounting on this host
                (d / f).write_text(v)
    except OSError:
        _remove_groups(made)
        raise
    return made


def _sweep_orphans(parent: Path) -> None:
    """Remove the empty groups of trainers that died mid-call (SIGKILL leaves no chance to clean up)."""
    for d in parent.glob("call-*-*"):
        try:
            os.kill(int(d.name.split("-")[1]), 0)
            continue  # its trainer is alive: the group may be in use
        except PermissionError:
            continue  # alive, as another user
        except (ProcessLookupError, ValueError):
            pass
        with contextlib.suppress(OSError):  # not empty: something of it still runs; left alone
            d.rmdir()


def _remove_groups(groups: list[Path]) -> None:
    for d in groups:
        for _ in range(50):  # the group empties once the kernel has reaped its killed processes
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (d / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.02)
        else:
            log.warning("could not remove sandbox cgroup %s (processes still in it)", d)


def processes_of(uid: int, zombies: bool = True) -> list[int]:
    """Pids whose real uid is `uid`, zombies included unless asked: until reaped they still count against
    its quota."""
    out, want = [], str(uid)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if line.startswith(("State:", "Uid:")))
        except (OSError, ValueError):
            continue
        if fields.get("Uid", "").split()[:1] == [want] and (zombies or fields["State"].split()[0] not in "ZX"):
            out.append(int(pid))
    return out


def kill_uid(uid: int, wait_s: float = 10.0, zombies: bool = True) -> bool:
    """SIGKILL every process of `uid` until none is left, reaped ones included unless `zombies` is False
    (a fork bomb spawns while we kill, and the orphans' reaper may lag); True when clean."""
    deadline = time.monotonic() + wait_s
    while pids := processes_of(uid, zombies):
        if time.monotonic() > deadline:
            log.warning("processes %s of sandbox uid %d survived %.0f s of SIGKILL", pids[:10], uid, wait_s)
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    return True


def _lock_dir() -> Path:
    """Root's lock folder; refuses one another user made (it could hold our uids hostage)."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(LOCK_DIR)
    if st.st_uid != os.geteuid() or not os.path.isdir(LOCK_DIR) or os.path.islink(LOCK_DIR):
        raise PermissionError(f"{LOCK_DIR} is not a folder owned by uid {os.geteuid()}; remove it")
    return LOCK_DIR


@contextlib.contextmanager
def _hold_uid(uid_base: int, uid_count: int, wait_s: float):
    """An exclusive lock on one uid of the pool (a free one, tried from a random start), held until exit."""
    folder, deadline = _lock_dir(), time.monotonic() + wait_s
    while True:
        start = random.randrange(uid_count)
        for k in range(uid_count):
            uid = uid_base + (start + k) % uid_count
            fh = open(folder / f"{uid}.lock", "a")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            try:
                yield uid
            finally:
                fh.close()  # closing releases the lock
            return
        if time.monotonic() > deadline:
            raise NoFreeSlot(
                f"all {uid_count} sandbox uids ({uid_base}..{uid_base + uid_count - 1}) stayed busy "
                f"for {wait_s:.0f} s; raise sandbox.uid_count"
            )
        time.sleep(0.05)


def budgets() -> str:
    """Which per-call budget this process gets: `uids+cgroup`, `uids`, `cgroup` or `shared`."""
    parts = (["uids"] if os.geteuid() == 0 else []) + (["cgroup"] if cgroup_parents() else [])
    return "+".join(parts) or "shared"


@functools.cache
def warn_if_shared() -> None:
    if budgets() == "shared":
        log.warning(
            "sandbox calls share one process quota (the trainer is not root and cannot create cgroups): "
            "a runaway program can stop other calls from starting; such calls are retried, then "
            "recorded as infrastructure faults and not scored"
        )


@contextlib.contextmanager
def slot(uid_base: int, uid_count: int, max_processes: int, memory_mb: int, wait_s: float = 60.0):
    """A slot for one call; on exit every process of it is killed and its cgroups removed."""
    with contextlib.ExitStack() as stack:
        uid = stack.enter_context(_hold_uid(uid_base, uid_count, wait_s)) if os.geteuid() == 0 else None
        if uid is not None:
            kill_uid(uid)  # a trainer killed mid-call, or a slow reaper, may have left processes of this uid
            # at the end, only until nothing of the call runs: its zombies are the reaper's (bwrap's own init
            # is reparented to pid 1 as it exits, and some inits reap it seconds later), and this uid's next
            # call waits for them above
            stack.callback(kill_uid, uid, 2.0, zombies=False)
        groups = _make_groups(cgroup_parents(), max_processes, memory_mb) if cgroup_parents() else []
        stack.callback(_remove_groups, groups)
        yield Slot(uid, groups)
