"""HOW the steps compose: the train / evaluate flows, the run config, the CLI."""
