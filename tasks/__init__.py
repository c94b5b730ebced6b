"""The DAG steps as Prefect tasks, and the math they wrap as plain functions."""
