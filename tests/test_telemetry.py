"""Nothing phones home (infra/telemetry.py): every library's usage reporting is off by default in the
processes teamrl starts, a user can opt back in, and `teamrl train` (with its temporary Prefect server) and
`make server` (infra/server.sh: Prefect server, worker, MLflow UI) make no connection beyond 127.0.0.1.

The children run with tests/netguard on PYTHONPATH, which refuses and logs every outbound lookup or
connection, and without the variables that make libraries keep quiet on their own (a test runner, a CI
service), so that only teamrl's defaults can switch reporting off."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import run_in_session

from infra.engines.zero import free_port
from infra.telemetry import OFF

ROOT = Path(__file__).resolve().parents[1]
GUARD = ROOT / "tests" / "netguard"
SELF_QUIET = {  # MLflow's and Prefect's signs of a test or CI environment
    "PYTEST_CURRENT_TEST",
    "CI",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "CIRCLECI",
    "JENKINS_URL",
    "TRAVIS",
    "TF_BUILD",
    "BUILDKITE",
    "TEAMCITY_VERSION",
    "BITBUCKET_BUILD_NUMBER",
    "BITBUCKET_COMMIT",
    "CODEBUILD_BUILD_ARN",
    "CODEBUILD_BUILD_ID",
    "CLOUD_RUN_EXECUTION",
    "RUNBOT_HOST_URL",
    "RUNBOT_BUILD_NAME",
    "RUNBOT_WORKER_ID",
    "DRONE",
    "SEMAPHORE",
    "APPVEYOR",
    "BUDDY",
    "CI_NAME",
}
OPT_IN = {
    "DO_NOT_TRACK": "0",
    "MLFLOW_DISABLE_TELEMETRY": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "true",
    "HF_HUB_DISABLE_TELEMETRY": "0",
    "RAY_USAGE_STATS_ENABLED": "1",
}

# each library's own verdict, in a process that imports teamrl first, as the CLI and flow runs do
PROBE = """
import json
import flows
import huggingface_hub.constants as hf
import mlflow.telemetry.client as mlflow_telemetry
from prefect._internal.analytics import is_telemetry_enabled
from prefect.settings import get_current_settings
verdict = {"mlflow": mlflow_telemetry.get_telemetry_client() is not None, "prefect client": is_telemetry_enabled(),
           "prefect server": get_current_settings().server.analytics_enabled,
           "huggingface hub": not hf.HF_HUB_DISABLE_TELEMETRY}
try:
    from ray._common.usage.usage_lib import usage_stats_enabled
    verdict["ray"] = usage_stats_enabled()
except ImportError:  # the `ray` extra is not installed
    pass
print(json.dumps(verdict))
"""


def child_env(log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OFF and k not in SELF_QUIET and k != "PREFECT_API_URL"}
    path = os.pathsep.join(filter(None, [str(GUARD), env.get("PYTHONPATH")]))
    return env | {"PYTHONPATH": path, "NETGUARD_LOG": str(log), "HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"} | extra


def outbound(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def probe(env: dict[str, str]) -> dict[str, bool]:
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.splitlines()[-1])


def test_reporting_is_off_by_default_and_a_user_can_opt_in(tmp_path):
    log = tmp_path / "outbound.log"
    off = probe(child_env(log))
    assert {"mlflow", "prefect client", "prefect server", "huggingface hub"} <= off.keys()
    assert not any(off.values()), off
    assert outbound(log) == ""
    on = probe(child_env(log, **OPT_IN))
    assert on.keys() == off.keys() and all(on.values()), on


@pytest.mark.slow
def test_train_and_server_connect_nowhere_but_loopback(tmp_path):
    log = tmp_path / "outbound.log"
    env = child_env(log, PREFECT_HOME=str(tmp_path / "prefect"))
    rc, out = run_in_session(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "train",
            "tiny",
            "--set",
            f"run.dir={tmp_path / 'runs'}",
            "--set",
            "iterations=1",
            "--set",
            "evaluate=false",
        ],
        env,
        tmp_path / "train.log",
    )
    assert rc == 0, out[-3000:]
    assert "telemetry" not in out.lower(), out[-3000:]  # e.g. "Failed to send telemetry" from the Prefect server
    assert outbound(log) == ""

    state, mlflow_port = tmp_path / "server", free_port()
    env |= {
        "SERVER_STATE": str(state),
        "RUNS": str(tmp_path / "runs"),
        "PREFECT_PORT": str(free_port()),
        "MLFLOW_PORT": str(mlflow_port),
    }
    script = str(ROOT / "infra" / "server.sh")
    try:
        rc, out = run_in_session([script, "start"], env, tmp_path / "server.log")
        assert rc == 0, out[-3000:]
        # what the MLflow UI asks before it shows its usage-data notice
        with urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/ajax-api/3.0/mlflow/ui-telemetry") as r:
            assert json.load(r)["disable_ui_telemetry"] is True
    finally:
        subprocess.run([script, "stop"], env=env, timeout=120, capture_output=True)
    said = [
        line
        for p in state.glob("*.log")
        for line in p.read_text().splitlines()
        if "telemetry" in line.lower() and "/ui-telemetry" not in line
    ]  # not our request's access-log line
    assert said == []
    assert outbound(log) == ""
