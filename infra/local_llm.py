"""A local OpenAI-compatible server for the `llm` coach: `transformers serve` on 127.0.0.1, for tests and
measurements that need a real endpoint and no network (a stronger coach belongs on a vLLM server)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def transformers_serve(
    model_dir: str | Path, start_timeout_s: float = 120.0, port: int | None = None, continuous_batching: bool = True
):
    """Serve `model_dir` on `port` (None: a free one) of 127.0.0.1 for the block; yields the `/v1` base URL.
    Raises RuntimeError when the port is taken, or the server exits or is not healthy within `start_timeout_s`.
    `continuous_batching` batches concurrent requests (without it the server answers them one at a time:
    8 concurrent coach requests to SmolLM2-135M took 30 s against 14 s on this 2-core CPU)."""
    import requests

    if port is None:
        port = free_port()
    else:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"127.0.0.1:{port} is already in use: stop what listens there first")
    exe = Path(sys.executable).parent / "transformers"
    # the server ends with this process however it ends (infra/die_with_parent.py), not only at the block's exit
    # (SIGKILL: on SIGTERM it would first finish every generation queued by the dead process)
    launcher = [sys.executable, "-I", str(Path(__file__).with_name("die_with_parent.py")), str(os.getpid()), "--kill"]
    proc = subprocess.Popen(
        [
            *launcher,
            *(str(exe), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"),
            *(["--continuous-batching"] if continuous_batching else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"transformers serve exited: {err[-2000:]}")
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve was not healthy within {start_timeout_s:.0f} s")
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
