"""A tensor-parallel plan as the simulator replays it from a measured profile.

The simulator cuts layers over a tensor-parallel group only for the models it generates
(``sim.models.shard_model``); a measured profile's layers are whole. ``dapple-run profile``
and ``validate`` therefore measure each layer as one device of its tensor-parallel group
holds and runs it (``runtime.measure.profiler.profile_layer`` with a mesh: its share of the
parameters, the activations it saves, its collectives inside its forward and backward time,
the 1/t of the sequence it sends on) and hand the simulator a plan in which every
tensor-parallel group is one device: the same stages, replicas and schedule, each device of
the measured scenario standing for the t devices of one group, which run the same actions
on the same samples at the same time and hold the same bytes. What the simulator predicts
for simulated device g it predicts for every device of group g (``expand_view``); the
tensor-parallel collectives are measured, not modelled, in this comparison.

Every group's devices are consecutive ids in Megatron's layout, so group g holds
devices ``g·t .. g·t + t − 1`` exactly when the plan numbers its devices that way;
``tensor_group_ids`` numbers the groups in order of their first device either way.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.core.plan import PlanSpec
from sim.core.validation_sides import RunSide
from sim.report.analysis.validation import run_side

__all__ = ["collapsed_stages", "expand_view", "tensor_group_ids"]


def tensor_group_ids(plan: PlanSpec) -> dict[int, int]:
    """Device -> the id of its tensor-parallel group (groups numbered by their first device)."""
    groups = sorted({group for s in range(plan.num_stages) for group in plan.tensor_groups(s)}, key=min)
    return {device: g for g, group in enumerate(groups) for device in group}


def collapsed_stages(plan: PlanSpec) -> list[dict[str, Any]]:
    """The plan's stages with each tensor-parallel group as one device (a plan file's ``stages``)."""
    ids = tensor_group_ids(plan)
    stages = []
    for s, stage in enumerate(plan.stages):
        devices = [ids[group[0]] for group in plan.tensor_groups(s)]
        stages.append({"layers": list(stage.layers), "devices": devices})
    return stages


def expand_view(view: RunSide, plan: PlanSpec) -> RunSide:
    """A prediction (``sim.report.analysis.validation.predicted_view``) of the collapsed plan, with
    every simulated device's entry and events repeated for each device of its group."""
    ids = tensor_group_ids(plan)
    members: dict[int, list[int]] = {}
    for device, g in sorted(ids.items()):
        members.setdefault(g, []).append(device)
    devices = [replace(entry, device=device) for entry in view.devices for device in members[entry.device]]
    events = [replace(row, device=device) for row in view.events for device in members[row.device]]
    return run_side(iteration_time_s=view.iteration_time_s, iteration_times_s=view.iteration_times_s,
                    devices=sorted(devices, key=lambda d: d.device),
                    events=sorted(events, key=lambda e: (e.device, e.start_s, e.end_s)))
