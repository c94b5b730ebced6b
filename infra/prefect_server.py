"""Prefect's temporary API server, out of the terminal's reach.

Without PREFECT_API_URL, Prefect starts a temporary server as a child in its caller's process group. A
Ctrl-C in the terminal signals the whole foreground group, so it stops that server too, and the flow run
can no longer record how it ended: the client retries the dead server for minutes. `start_temporary_server`
starts the same server in a session of its own, where a Ctrl-C does not reach it. It still stops with the
process that started it: at that process's exit (Prefect's own exit handler), or, when that process is
killed, by the kernel's parent-death signal (Linux; infra/die_with_parent.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    get_current_settings,
)


class DetachedServer(SubprocessASGIServer):
    """Prefect's SubprocessASGIServer, its uvicorn started in a new session, to die with this process."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # the command and environment of SubprocessASGIServer._run_uvicorn_command (Prefect 3)
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "--app-dir",
            str(prefect.__module_path__.parent),
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True),
        }
        launcher = [sys.executable, "-I", str(Path(__file__).with_name("die_with_parent.py")), str(os.getpid())]
        return subprocess.Popen([*launcher, *command], env=env, start_new_session=True)


def start_temporary_server() -> None:
    """When no Prefect API is configured (and Prefect may start a temporary server), start that server
    now, detached. Prefect finds it where it keeps its temporary server (SubprocessASGIServer() returns
    it), so every client and flow run of this process uses it."""
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    # several runs starting at once on a small machine can take longer than Prefect's 20 s default to migrate
    # and serve their SQLite databases (seen with three runs on 2 cores)
    timeout = max(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), 120)
    DetachedServer().start(timeout=timeout)  # registered as SubprocessASGIServer's instance for the default port
