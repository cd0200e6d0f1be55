"""The DAPPLE planner and its baselines (imports ``sim``; never ``runtime``)."""
