"""The columns of a sweep's table: each metric a point reports, with its pandas dtype.

``planner.sweeps.run`` builds the table with them and ``planner.sweeps.checks`` checks that a
sweep file's plots name only columns the table will have.
"""

from __future__ import annotations

__all__ = ["COLUMNS", "PLAN_COLUMNS", "RUN_COLUMNS", "TAIL_COLUMNS"]

COLUMNS: dict[str, str] = {
    "scenario": "string", "model_name": "string", "device_name": "string", "num_nodes": "Int64",
    "cluster_devices": "Int64", "schedule": "string", "num_stages": "Int64", "num_devices": "Int64",
    "global_batch_size": "Int64", "microbatch_size": "Int64", "num_microbatches": "Int64", "recompute": "boolean",
    "iteration_time_s": "float64", "throughput_samples_per_s": "float64", "bubble_fraction": "float64",
    "mfu": "float64", "peak_memory_bytes": "float64", "min_peak_memory_bytes": "float64",
    "memory_capacity_bytes": "float64", "oom": "boolean", "oom_device": "Int64", "oom_overshoot_bytes": "float64",
}
RUN_COLUMNS: dict[str, str] = {
    "days": "float64", "expected_days": "float64", "gpu_hours": "float64", "expected_gpu_hours": "float64",
    "cost": "float64", "energy_mwh": "float64", "goodput": "float64",
}
"""The whole run of a point whose scenario sets ``training.tokens`` or ``steps``
(``sim.cost.capacity.estimate_run``): days without and with failures, GPU-hours (the expected ones
with failures), cost (None without a price), energy in MWh (with failures when it has a reliability
section), goodput; empty otherwise."""
"""Metric columns of every table (name -> pandas dtype), after the point id and axis columns."""
PLAN_COLUMNS: dict[str, str] = {
    "plan_description": "string", "plan_placement": "string", "plan_json": "string", "planner_note": "string",
}
"""Extra columns of ``mode: plan``: the plan found (``plan_json`` is a plan file) or why none fits."""
TAIL_COLUMNS: dict[str, str] = {"error": "string", "wall_s": "float64"}
"""Columns every table ends with: why a point failed, and its wall-clock seconds."""
