"""Plan files: the JSON that the planner writes and the simulator and runtime read.

A plan file holds what ``docs/architecture.md`` calls a plan::

    {"schedule": "dapple", "num_microbatches": 8, "microbatch_size": 16, "recompute": false,
     "stages": [{"layers": [0, 27], "devices": [0, 1, 2, 3, 4, 5, 6, 7]}, ...]}

``schedule`` may also be a mapping (``{"name": "dapple", "policy": "2(s-i)-1"}``), exactly as
in a scenario's ``plan:``. A plan is applied to a scenario by replacing its ``plan:`` section
and its micro-batch size, and the result goes through the scenario loader, so a plan file is
checked as strictly as a scenario (devices in range, layers covering the model, a schedule
that can run). ``num_microbatches`` must agree with the scenario's global batch.

A plan file holds the plan alone: what a planner measured of it (its description, placement,
iteration time, ...) goes beside it, in ``best_plan_metrics.json`` or ``dapple-plan --json``'s
``best_metrics``, never inside it. Plan files written before that split carry those metrics
next to the plan; ``read_plan_file`` still reads them, drops the metric keys
(``LEGACY_METRIC_KEYS``) and logs a note saying so. A whole ``dapple-plan --json`` output is
read as its ``best`` plan.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from sim.core.errors import ScenarioError
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.parallelism import Sharding
from sim.core.plan import PlanSpec
from sim.core.training import TrainingSpec
from sim.core.userfiles import read_user_file, show_path
from sim.input.strict import show_text, show_value
from sim.input.yaml_text import check_nesting

__all__ = ["LEGACY_METRIC_KEYS", "PARALLEL_KEYS", "PLAN_KEYS", "plan_to_dict", "read_plan_file", "merge_plan",
           "schedule_text"]

log = logging.getLogger(__name__)

PARALLEL_KEYS = ("tensor_parallel", "sequence_parallel", "context_parallel", "sharding", "expert_parallel",
                 "expert_tensor_parallel")
"""The plan's parallel degrees; a plan file writes those that differ from their defaults."""

PLAN_KEYS = {"schedule", "num_microbatches", "microbatch_size", "recompute", "stages", "overlap", "fsdp", *PARALLEL_KEYS}
"""Keys of a plan file (keys that start with ``_`` are comments and ignored; any other is an error)."""

LEGACY_METRIC_KEYS = frozenset({
    "metrics", "planner", "placement", "engine", "iteration_time_s", "throughput_samples_per_s",
    "peak_memory_bytes", "oom", "speedup_over_dp", "description", "layout",
})
"""Keys that plan files written before plans and metrics were split carried beside the plan:
``read_plan_file`` drops them with a note, so old files still read. New files never hold them."""

METRICS_HOME = "best_plan_metrics.json beside best_plan.json, or dapple-plan --json's best_metrics"
"""Where a plan's metrics are now, as the note on an old plan file says."""


def plan_to_dict(plan: PlanSpec, training: TrainingSpec) -> dict[str, Any]:
    """The plan-file form of ``plan`` for ``training`` (JSON-ready)."""
    # the generator's parameters (a dapple policy of auto is decided again from the scenario's
    # costs, the same way for the same scenario) and how much an overlapped pair hides
    params = {**plan.params, **({"overlap_efficiency": plan.overlap_efficiency} if plan.overlap_efficiency else {})}
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
    schedule: Any = plan.schedule if not params else {"name": plan.schedule, **params}
    data = {
        "schedule": schedule,
        "num_microbatches": training.num_microbatches,
        "microbatch_size": training.microbatch_size,
        "recompute": plan.recompute.to_json(),
        "stages": [{"layers": list(stage.layers), "devices": list(stage.devices)} for stage in plan.stages],
    }
    defaults = {"tensor_parallel": 1, "sequence_parallel": False, "context_parallel": 1, "sharding": Sharding.NONE,
                "expert_parallel": 1, "expert_tensor_parallel": 1}
    for key in PARALLEL_KEYS:
        value = getattr(plan, key)
        if value != defaults[key]:
            data[key] = value.value if isinstance(value, Sharding) else value
    for key, default in (("overlap", OverlapSpec()), ("fsdp", FsdpSpec())):
        if getattr(plan, key) != default:  # written only when a stack or the plan changed them
            data[key] = getattr(plan, key).to_json()
    return data


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """Read a plan file: the plan alone (a whole ``dapple-plan --json`` output gives its ``best``;
    an old file's metric keys are dropped with a logged note). A missing, unreadable or
    non-JSON file is a one-line error."""
    path = Path(path)
    shown = show_path(path)
    text = read_user_file(path, "plan file", ScenarioError)
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_int=_number(int), parse_float=_number(float))
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{shown}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except _Refused as exc:
        raise ScenarioError(f"{shown}: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{shown}: nested too deep to read (a plan nests 4 deep)") from None
    check_nesting(data, where=shown)
    if isinstance(data, dict) and "best" in data and isinstance(data["best"], dict):
        data = data["best"]  # the planner's --json output: take its best plan
    if not isinstance(data, dict):
        raise ScenarioError(f"{shown}: a plan file is a JSON object with {', '.join(sorted(PLAN_KEYS))}")
    legacy = sorted(key for key in data if key in LEGACY_METRIC_KEYS)
    if legacy:
        log.info("%s: metrics keys %s are ignored; plan files now hold the plan alone (metrics are in %s)",
                 shown, ", ".join(legacy), METRICS_HOME)
        data = {key: value for key, value in data.items() if key not in LEGACY_METRIC_KEYS}
    return data


class _Refused(Exception):
    """A number the plan reader does not take."""


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number a plan can hold; write a finite number")


def _number(kind: type):
    """``json.loads``' reader of a number: at most 100 characters (and never 4300-digit integers)."""
    def read(text: str):
        if len(text) > 100:
            raise _Refused(f"a number of {len(text)} characters; numbers here have at most 100")
        return kind(text)
    return read


def merge_plan(raw: dict, plan: Mapping[str, Any], *, source: str) -> dict:
    """Return scenario mapping ``raw`` with its plan and micro-batch size taken from ``plan``."""
    unknown = sorted(k for k in plan if k not in PLAN_KEYS and not str(k).startswith("_"))
    if unknown:
        raise ScenarioError(f"{source}: {show_text(str(unknown[0]))}: unknown plan key; "
                            f"valid: {', '.join(sorted(PLAN_KEYS))}")
    if "stages" not in plan:
        raise ScenarioError(f"{source}: stages: missing from the plan file")
    merged = dict(raw)
    section = {"stages": plan["stages"], "recompute": plan.get("recompute", False)}
    section.update((key, plan[key]) for key in (*PARALLEL_KEYS, "overlap", "fsdp") if key in plan)
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
            f"{source}: num_microbatches: the plan says {show_value(wanted)} but the scenario's global batch {global_batch} "
            f"over micro-batches of {size} gives {global_batch // size}"
        )
    return merged


def schedule_text(schedule: str | dict[str, Any]) -> str:
    """A plan file's ``schedule`` (``plan_to_dict``'s: a name, or a mapping of a name and its
    parameters) in one short form: ``dapple``, ``dapple/2(s-i)-1`` (a policy),
    ``interleaved/chunks=2`` (any other parameter). The planner's table and a sweep's
    ``schedule`` column show a schedule so."""
    if isinstance(schedule, str):
        return schedule
    params = {k: v for k, v in schedule.items() if k != "name"}
    return "/".join([str(schedule.get("name", "?"))] + [str(v) if k == "policy" else f"{k}={v}"
                                                        for k, v in sorted(params.items(), key=lambda kv: str(kv[0]))])
