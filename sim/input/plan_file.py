"""Plan files: the JSON that the planner writes and the simulator and runtime read.

A plan file holds what ``docs/architecture.md`` calls a plan::

    {"schedule": "dapple", "num_microbatches": 8, "microbatch_size": 16, "recompute": false,
     "stages": [{"layers": [0, 27], "devices": [0, 1, 2, 3, 4, 5, 6, 7]}, ...]}

``schedule`` may also be a mapping (``{"name": "dapple", "policy": "2(s-i)-1"}``), exactly as
in a scenario's ``plan:``. A plan is applied to a scenario by replacing its ``plan:`` section
and its micro-batch size, and the result goes through the scenario loader, so a plan file is
checked as strictly as a scenario (devices in range, layers covering the model, a schedule
that can run). ``num_microbatches`` must agree with the scenario's global batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from sim.errors import ScenarioError, read_user_file
from sim.plan import PlanSpec
from sim.specs import TrainingSpec

__all__ = ["PLAN_KEYS", "plan_to_dict", "read_plan_file", "merge_plan"]

PLAN_KEYS = {"schedule", "num_microbatches", "microbatch_size", "recompute", "stages"}
"""Keys of a plan file (extra keys such as metrics are ignored when they start with ``_``
or are listed in ``IGNORED_KEYS``)."""

IGNORED_KEYS = {
    "metrics", "planner", "placement", "engine", "iteration_time_s", "throughput_samples_per_s",
    "peak_memory_bytes", "oom", "speedup_over_dp", "description",
}
"""Keys a planner may add next to a plan; they describe it and are not read back."""


def plan_to_dict(plan: PlanSpec, training: TrainingSpec) -> dict[str, Any]:
    """The plan-file form of ``plan`` for ``training`` (JSON-ready)."""
    schedule: Any = plan.schedule if not plan.schedule_params else {"name": plan.schedule, **plan.params}
    return {
        "schedule": schedule,
        "num_microbatches": training.num_microbatches,
        "microbatch_size": training.microbatch_size,
        "recompute": plan.recompute,
        "stages": [{"layers": list(stage.layers), "devices": list(stage.devices)} for stage in plan.stages],
    }


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """Read a plan file; a missing, unreadable or non-JSON file is a one-line error."""
    path = Path(path)
    text = read_user_file(path, "plan file", ScenarioError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if isinstance(data, dict) and "best" in data and isinstance(data["best"], dict):
        data = data["best"]  # the planner's --json output: take its best plan
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a plan file is a JSON object with {', '.join(sorted(PLAN_KEYS))}")
    return data


def merge_plan(raw: dict, plan: Mapping[str, Any], *, source: str) -> dict:
    """Return scenario mapping ``raw`` with its plan and micro-batch size taken from ``plan``."""
    unknown = sorted(k for k in plan if k not in PLAN_KEYS and k not in IGNORED_KEYS and not str(k).startswith("_"))
    if unknown:
        raise ScenarioError(f"{source}: {unknown[0]}: unknown plan key; valid: {', '.join(sorted(PLAN_KEYS))}")
    if "stages" not in plan:
        raise ScenarioError(f"{source}: stages: missing from the plan file")
    merged = dict(raw)
    section = {"stages": plan["stages"], "recompute": plan.get("recompute", False)}
    if "schedule" in plan:
        section["schedule"] = plan["schedule"]
    merged["plan"] = section
    training = dict(raw.get("training") or {}) if isinstance(raw.get("training"), dict) else {}
    if "microbatch_size" in plan:
        training["microbatch_size"] = plan["microbatch_size"]
    merged["training"] = training
    wanted = plan.get("num_microbatches")
    global_batch, size = training.get("global_batch_size"), training.get("microbatch_size")
    if wanted is not None and isinstance(global_batch, int) and isinstance(size, int) and size > 0 \
            and global_batch // size != wanted:
        raise ScenarioError(
            f"{source}: num_microbatches: the plan says {wanted} but the scenario's global batch {global_batch} "
            f"over micro-batches of {size} gives {global_batch // size}"
        )
    return merged
