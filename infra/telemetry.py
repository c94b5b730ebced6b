"""Usage reporting off in every process teamrl starts: each library's switch set to "off" as a default.

Imported first by the `flows` package (the CLI, and every flow a Prefect worker runs, import it before
Prefect or MLflow do their work) and by tests/conftest.py; infra/server.sh exports the same defaults for
the Prefect server, its worker and the MLflow UI (`python -m infra.telemetry` prints them).

Only unset variables are set, so a user opts back in by setting one, e.g.
`DO_NOT_TRACK=0 MLFLOW_DISABLE_TELEMETRY=false PREFECT_SERVER_ANALYTICS_ENABLED=true teamrl train tiny`.
"""

from __future__ import annotations

import os

OFF = {
    "DO_NOT_TRACK": "1",  # the shared convention; Prefect's client SDK has no other switch
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # Prefect server, `teamrl train`'s temporary one included
    "MLFLOW_DISABLE_TELEMETRY": "true",  # MLflow client, server, and its UI's usage-data notice
    "HF_HUB_DISABLE_TELEMETRY": "1",  # Hugging Face Hub and transformers
    "RAY_USAGE_STATS_ENABLED": "0",  # Ray (engines.runner=ray)
    "VLLM_NO_USAGE_STATS": "1",  # vLLM (engines.generation=vllm)
}

for _name, _value in OFF.items():
    os.environ.setdefault(_name, _value)

if __name__ == "__main__":
    print("\n".join(f"{name}={value}" for name, value in OFF.items()))
