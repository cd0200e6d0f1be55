"""The ``plan:`` section: contiguous layer ranges on device groups, and a schedule.

A plan cuts the model into stages, each a ``[start, end)`` range of layers on one or more
devices (more than one: data-parallel replicas of that stage), and names the schedule that
orders their forwards and backwards, or a schedule file written in
``torch.distributed.pipelining``'s action text::

    plan:
      schedule: {name: dapple, policy: 2(s-i)-1}   # or schedule_file: my_schedule.txt
      stages:
      - {layers: [0, 27], devices: "0-7"}
      - {layers: [27, 53], devices: "8-15"}

Beyond the keys, the plan is checked as a whole (``sim.plan.check_plan``: the ranges cover
the model without gaps or overlaps, no device is used twice), and its schedule is generated
(or parsed and checked) once here, so a schedule that cannot run is a scenario error.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.errors import ScenarioError, ScheduleError, SpecError
from sim.input.strict import StrictReader, device_ids, join_key, show_value
from sim.plan import PlanSpec, StageSpec, check_plan
from sim.model_spec import ModelSpec
from sim.specs import ClusterSpec, TrainingSpec

__all__ = ["read_plan"]


def read_plan(reader: StrictReader, data: Any, cluster: ClusterSpec, model: ModelSpec, training: TrainingSpec) -> PlanSpec:
    """The plan of a scenario's ``plan:`` mapping, checked against the cluster, model and training."""
    from sim.schedule.plan_schedule import parse_schedule_for_plan, schedule_for_plan

    data = reader.mapping(data, "plan")
    reader.keys(data, "plan", allowed={"schedule", "schedule_file", "stages", "recompute"}, required={"stages"})
    if "schedule" in data and "schedule_file" in data:
        raise reader.fail("plan", "give either 'schedule' (a generator name) or 'schedule_file', not both")
    stages_raw = data["stages"]
    if not isinstance(stages_raw, list) or not stages_raw:
        raise reader.fail("plan.stages", f"must be a non-empty list of {{layers: [start, end], devices: [...]}}, got {show_value(stages_raw)}")
    stages = tuple(_stage(reader, item, f"plan.stages[{i}]", cluster.num_devices) for i, item in enumerate(stages_raw))
    name, params = ("file", {}) if "schedule_file" in data else _schedule_name(reader, data.get("schedule", "dapple"))
    plan = reader.build(
        "plan",
        PlanSpec,
        stages=stages,
        schedule=name,
        schedule_params=tuple(sorted(params.items())),
        recompute=reader.boolean(data, "plan", "recompute", False),
        schedule_file=str(reader.path(data["schedule_file"], "plan.schedule_file", data_fallback=False))
        if "schedule_file" in data
        else None,
    )
    try:
        check_plan(plan, num_layers=model.num_layers, num_devices=cluster.num_devices)
    except SpecError as exc:
        raise reader.fail(join_key("plan", exc.key), exc.problem) from None
    try:
        if plan.schedule_file is not None:
            text = Path(plan.schedule_file).read_text(encoding="utf-8")
            plan = replace(plan, custom_schedule=parse_schedule_for_plan(plan, training.num_microbatches, text))
        else:
            schedule_for_plan(plan, training.num_microbatches)
    except ScheduleError as exc:
        key = "plan.schedule_file" if plan.schedule_file else "plan.schedule"
        raise ScenarioError(f"{reader.source}: {key}: {exc}" + (f"\n{exc.detail}" if exc.detail else "")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise reader.fail("plan.schedule_file", f"cannot read ({exc.__class__.__name__})") from None
    return plan


def _schedule_name(reader: StrictReader, value: Any) -> tuple[str, dict]:
    from sim.schedule.generators import GENERATORS
    from sim.schedule.policy import DapplePolicy

    if isinstance(value, str):
        value = {"name": value}
    data = reader.mapping(value, "plan.schedule")
    reader.keys(data, "plan.schedule", allowed={"name", "policy", "chunks"}, required={"name"})
    name = reader.string(data, "plan.schedule", "name", choices=GENERATORS)
    params = {}
    if "policy" in data:
        params["policy"] = reader.string(data, "plan.schedule", "policy", choices={p.value for p in DapplePolicy})
    if "chunks" in data:
        params["chunks"] = reader.integer(data, "plan.schedule", "chunks")
    return name, params


def _stage(reader: StrictReader, data: Any, key: str, num_devices: int) -> StageSpec:
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed={"layers", "devices"}, required={"layers", "devices"})
    layers = data["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
    ):
        raise reader.fail(join_key(key, "layers"), f"must be [start, end] (two integers, end exclusive), got {show_value(layers)}")
    devices = device_ids(reader, data["devices"], join_key(key, "devices"), num_devices)
    return reader.build(key, StageSpec, layers=(layers[0], layers[1]), devices=devices)
