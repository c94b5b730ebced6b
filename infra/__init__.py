"""WHERE teamrl runs: engines, trainers, the trajectory store, tracking, sandbox, model loading."""
