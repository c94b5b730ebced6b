"""A full disk as a clear error. The run's writers (Parquet partitions, checkpoints) write under temporary
names and rename into place inside `writing`: when a write fails, its temporaries are removed, so no partial
file remains, and a full disk (or quota) is raised as `DiskFullError`, which names the file and the space
left. The run then resumes once space is freed (`teamrl train --resume`)."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from infra.errors import TeamrlError

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(TeamrlError, OSError):
    """A write ran out of disk space: `errno` is ENOSPC (or EDQUOT), `filename` the path being written, and the
    message names it and the free space left on its file system."""

    resumable = True

    def __str__(self) -> str:
        return str(self.strerror)


def full_disk_errno(e: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT when `e`, or the exception it was raised from or while handling, is a full disk;
    else None. Some writers hide the OSError: torch wraps it in a RuntimeError (as its context when it
    writes to a Python file), safetensors reports it only in its message."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL:
            return e.errno
        for code in _FULL:
            if os.strerror(code) in str(e):
                return code
        e = e.__cause__ or e.__context__
    return None


def space_left(path: str | Path) -> str:
    """`<free> MiB free on <mount point>` for the file system that holds (or will hold) `path`."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    mount = p
    while not os.path.ismount(mount):
        mount = mount.parent
    return f"{shutil.disk_usage(p).free / 2**20:.1f} MiB free on {mount}"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def writing(path: str | Path, *temporaries: Path):
    """The block writes `path` by way of `temporaries` (files or folders it renames into place). If the block
    fails, however (a full disk, an error, Ctrl-C), the temporaries are removed; a full disk is re-raised as
    DiskFullError naming `path`."""
    try:
        yield
    except BaseException as e:
        for t in temporaries:
            _remove(t)
        code = full_disk_errno(e) if isinstance(e, Exception) else None
        if code is None:
            raise
        what = os.strerror(code).lower()
        raise DiskFullError(code, f"{what} writing {path} ({space_left(path)})", str(path)) from e
