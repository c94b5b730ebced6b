"""HOW the steps compose: the train / evaluate flows, the run config, the CLI."""

import infra.telemetry  # noqa: F401  (usage reporting off before Prefect and MLflow start their clients)
