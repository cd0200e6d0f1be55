"""Describe a checked scenario: what ``dapple-sim check`` reports before anything runs.

The description is plain data (for ``--json``) with the numbers a user wants to see before
simulating: how many layers and devices, how the plan cuts the model, how each micro-batch
is split over a stage's replicas, what each stage costs per micro-batch, and how much memory
every device holds at rest (parameters, gradients and optimizer state, before activations).
A custom device's numbers that the file left out are listed with the defaults they took
(``device_defaults``: the keys; ``device_default_values``: key -> value used and its rule).
Things that are allowed but probably unintended become ``warnings``.
"""

from __future__ import annotations

from typing import Any

from sim.cost.split import split_samples
from sim.cost.compute import stage_cost
from sim.models import shard_model
from sim.input.scenario import Scenario
from sim.core.units import format_bytes, format_time

__all__ = ["describe", "format_description"]


def describe(scenario: Scenario) -> dict[str, Any]:
    """A JSON-ready description of ``scenario``."""
    cluster, model, training, plan = scenario.cluster, scenario.model, scenario.training, scenario.plan
    info: dict[str, Any] = {
        "name": scenario.name,
        "num_layers": model.num_layers,
        "num_devices": cluster.num_devices,
        "nodes": cluster.nodes,
        "devices_per_node": cluster.devices_per_node,
        "device": cluster.device.name,
        "device_memory_bytes": cluster.device.memory_bytes,
        "device_defaults": [key for key, _ in scenario.device_defaults],
        "device_default_values": dict(scenario.device_defaults),
        "model": {
            "name": model.name,
            "source": model.source,
            "param_bytes": model.param_bytes(),
            "dtype": model.dtype,
            "optimizer": model.optimizer,
        },
        "global_batch_size": training.global_batch_size,
        "microbatch_size": training.microbatch_size,
        "num_microbatches": training.num_microbatches,
        "schedule": None,
        "num_stages": None,
        "stages": [],
        "devices": [],
        "warnings": [],
    }
    if plan is None:
        info["warnings"].append("no plan: the planner will choose one (dapple-plan)")
        return info
    info["schedule"] = plan.schedule if plan.custom_schedule is None else f"file:{plan.schedule_file}"
    info["schedule_params"] = plan.params
    info["recompute"] = plan.recompute.to_json()
    info["num_stages"] = plan.num_stages
    info["parallelism"] = {"tensor": plan.tensor_parallel, "context": plan.context_parallel,
                           "pipeline": len(plan.device_groups), "sequence_parallel": plan.sequence_parallel,
                           "sharding": plan.sharding.value,
                           "data": max(plan.num_replicas(s) for s in range(plan.num_stages))}
    info["group_spans"] = _group_spans(plan, cluster)
    for name, spans in info["group_spans"].items():
        if spans == "across servers" and name != "data-parallel":  # data parallelism across servers is the norm
            info["warnings"].append(f"{name} groups span servers: their collectives cross the NICs "
                                    f"(keep {name} groups inside a server of {cluster.devices_per_node} devices)")
    at_rest: dict[int, float] = {}
    at_rest_by_kind: dict[int, dict[str, float]] = {}
    stages_of: dict[int, list[int]] = {}
    part = shard_model(model, plan.shard)
    for index, stage in enumerate(plan.stages):
        start, end = stage.layers
        replicas = plan.num_replicas(index)
        slices = split_samples(training.microbatch_size, replicas)
        cost = stage_cost(part, cluster.device, start, end, max(slices), recompute=plan.recompute,
                          data_parallel=len(plan.gradient_groups(index)[0]), sharding=plan.sharding)
        idle = sum(1 for n in slices if n == 0)
        if idle:
            info["warnings"].append(
                f"stage {index}: a micro-batch of {training.microbatch_size} samples over {replicas} "
                f"replicas leaves {idle} replicas idle; use microbatch_size >= {replicas}"
            )
        info["stages"].append(
            {
                "stage": index,
                "layers": [start, end],
                "devices": list(stage.devices),
                "replicas": replicas,
                "samples_per_replica": list(slices),
                "param_bytes": cost.param_bytes,
                "fwd_s": cost.fwd_s,
                "bwd_s": cost.bwd_s,
                "stash_bytes_per_microbatch": cost.stash_bytes,
                "memory_at_rest_bytes": cost.static_bytes,
            }
        )
        for device in stage.devices:
            at_rest[device] = at_rest.get(device, 0.0) + cost.static_bytes
            kinds = at_rest_by_kind.setdefault(device, {"parameters": 0.0, "gradients": 0.0, "optimizer": 0.0})
            for kind in kinds:
                kinds[kind] += getattr(cost.states, kind)
            stages_of.setdefault(device, []).append(index)
    capacity = cluster.device.memory_bytes
    for device in sorted(at_rest):
        info["devices"].append(
            {
                "device": device,
                "node": cluster.node_of(device),
                "stages": stages_of[device],
                "memory_at_rest_bytes": at_rest[device],
                "memory_at_rest_by_kind_bytes": at_rest_by_kind[device],
                "fits_at_rest": at_rest[device] <= capacity,
            }
        )
    over = [d for d in sorted(at_rest) if at_rest[d] > capacity]
    if over:
        info["warnings"].append(
            f"devices {_ranges(over)} need {format_bytes(max(at_rest.values()))} at rest, more than their "
            f"{format_bytes(capacity)}; use more stages or fewer layers per stage"
        )
    unused = cluster.num_devices - len(at_rest)
    if unused:
        info["warnings"].append(f"{unused} of the cluster's {cluster.num_devices} devices are not used by the plan")
    return info


def _group_spans(plan, cluster) -> dict[str, str]:
    """Whether each kind of group (tensor, context, data) stays inside one server."""
    kinds = {"tensor-parallel": plan.tensor_groups, "context-parallel": plan.context_groups,
             "data-parallel": plan.gradient_groups}
    spans = {}
    for name, groups_of in kinds.items():
        groups = [g for s in range(plan.num_stages) for g in groups_of(s) if len(g) > 1]
        if groups:
            across = any(len({cluster.node_of(d) for d in g}) > 1 for g in groups)
            spans[name] = "across servers" if across else "inside one server"
    return spans


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    parts: list[str] = []
    start = prev = ids[0]
    for value in ids[1:] + [None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if value is not None:
            start = prev = value
    return ", ".join(parts)


def _device_defaults_line(info: dict[str, Any]) -> list[str]:
    """The custom device's numbers that the scenario left to their defaults, if any."""
    values = info.get("device_default_values") or {}
    if not values:
        return []
    used = ", ".join(f"{key} {values[key]}" for key in info["device_defaults"])
    return [f"device defaults (not in the file; sim.input.cluster): {used}"]


def format_description(info: dict[str, Any]) -> str:
    """The human-readable form of ``describe``'s output."""
    lines = [
        f"scenario {info['name']}: {info['model']['name']} ({info['num_layers']} layers, "
        f"{format_bytes(info['model']['param_bytes'])} of {info['model']['dtype']} parameters, {info['model']['optimizer']})",
        f"cluster: {info['nodes']} x {info['devices_per_node']} {info['device']} = {info['num_devices']} devices",
        *_device_defaults_line(info),
        f"training: global batch {info['global_batch_size']}, micro-batch {info['microbatch_size']} "
        f"-> {info['num_microbatches']} micro-batches",
    ]
    if info["num_stages"] is not None:
        params = "".join(f", {k}={v}" for k, v in sorted(info.get("schedule_params", {}).items()))
        recompute = info.get("recompute")
        recompute = "" if recompute is False else f", recompute {'full' if recompute is True else recompute}"
        lines.append(f"plan: {info['num_stages']} stages, schedule {info['schedule']}{params}{recompute}")
        degrees = info["parallelism"]
        lines.append(f"parallelism: tensor {degrees['tensor']}{' + sequence' if degrees['sequence_parallel'] else ''}"
                     f" x context {degrees['context']} x pipeline {degrees['pipeline']} x data {degrees['data']}, "
                     f"sharding {degrees['sharding']}"
                     + "".join(f"; {name} groups {span}" for name, span in info["group_spans"].items()))
        header = f"  {'stage':>5} {'layers':>9} {'replicas':>8} {'fwd/mb':>9} {'bwd/mb':>9} {'at rest':>10}"
        lines.append(header)
        for stage in info["stages"]:
            layers = f"[{stage['layers'][0]}, {stage['layers'][1]})"
            lines.append(
                f"  {stage['stage']:>5} {layers:>9} {stage['replicas']:>8} {format_time(stage['fwd_s']):>9} "
                f"{format_time(stage['bwd_s']):>9} {format_bytes(stage['memory_at_rest_bytes']):>10}"
            )
        top = max(info["devices"], key=lambda d: d["memory_at_rest_bytes"])
        kinds = ", ".join(f"{kind} {format_bytes(value)}" for kind, value in top["memory_at_rest_by_kind_bytes"].items())
        lines.append(
            f"memory at rest: at most {format_bytes(top['memory_at_rest_bytes'])} per device of "
            f"{format_bytes(info['device_memory_bytes'])} ({kinds})"
        )
    for warning in info["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
