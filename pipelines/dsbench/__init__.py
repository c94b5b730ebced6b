"""DSBench-style data-science team (pipelines/dsbench)."""
