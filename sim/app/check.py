"""Describe a checked scenario: what ``dapple-sim check`` reports before anything runs.

The description (``sim.app.description.Description``, JSON for ``--json`` by its ``to_json``)
has the numbers a user wants to see before simulating: how many layers and devices, how the
plan cuts the model, how each micro-batch is split over a stage's replicas, what each stage
costs per micro-batch (``sim.cost.compute.stage_cost``, as the engine's compiler calls it), and
how much memory every device holds at rest (parameters, gradients and optimizer state, before
activations: ``sim.cost.memory.stage_state_bytes``, the engine's and the planner's number too).
A custom device's numbers that the file left out are listed with the defaults they took
(``device_defaults``: the keys; ``device_default_values``: key -> value used and its rule).
Things that are allowed but probably unintended become ``warnings``.
"""

from __future__ import annotations

from sim.app.description import (
    Description,
    DeviceDescription,
    ModelDescription,
    ParallelismDescription,
    PlanDescription,
    StageDescription,
)
from sim.core.parallelism import Sharding
from sim.core.units import format_bandwidth, format_bytes, format_time
from sim.cost.comm import gradient_sync_bytes
from sim.cost.fabric_comm import across_choice, choice_text
from sim.cost.links import by_server
from sim.cost.memory import sum_state_bytes
from sim.cost.split import split_samples
from sim.cost.tiers import crossing_text, group_crossing, oversubscription_of, plan_crossings
from sim.engine.memory import held_by_stage
from sim.input.scenario import Scenario
from sim.models.moe import parameter_counts
from sim.models.vocab import vocab_padding

__all__ = ["describe", "format_description"]


def describe(scenario: Scenario) -> Description:
    """The description of ``scenario``."""
    cluster, model, training, plan = scenario.cluster, scenario.model, scenario.training, scenario.plan
    warnings: list[str] = []
    if plan is None:
        warnings.append("no plan: the planner will choose one (dapple-plan)")
    return Description(
        name=scenario.name, num_layers=model.num_layers, num_devices=cluster.num_devices, nodes=cluster.nodes,
        devices_per_node=cluster.devices_per_node, device=cluster.device.name,
        device_memory_bytes=cluster.device.memory_bytes,
        device_usable_memory_bytes=cluster.device.usable_memory_bytes, device_defaults=tuple(scenario.device_defaults),
        model=ModelDescription(name=model.name, source=model.source, param_bytes=model.param_bytes(),
                               dtype=model.dtype, optimizer=model.optimizer, attention=model.attention,
                               vocab_padding=vocab_padding(model, 1 if plan is None else plan.tensor_parallel),
                               parameters=None if model.experts is None else parameter_counts(model)),
        global_batch_size=training.global_batch_size, microbatch_size=training.microbatch_size,
        num_microbatches=training.num_microbatches,
        plan=None if plan is None else _describe_plan(scenario, warnings), warnings=tuple(warnings),
        stack=scenario.stack, stack_values=scenario.stack_values, run_keys=run_keys(scenario),
        fabric=fabric_line(cluster),
        placement=plan_crossings(plan, cluster) if plan is not None and cluster.fabric is not None else (),
        collectives=gradient_algorithms(scenario),
    )


def gradient_algorithms(scenario: Scenario) -> tuple[str, ...]:
    """On a fabric, the algorithm NCCL runs for each stage's data-parallel gradient message across
    servers (``sim.cost.fabric_comm.across_choice``, as the engine prices it): ``DP all-reduce 1.6 GiB:
    ring across the core``, each distinct line once, in stage order; empty without a fabric or a plan."""
    plan, cluster = scenario.plan, scenario.cluster
    if plan is None or cluster.fabric is None:
        return ()
    model, lines = scenario.resolved.model, []
    for s, stage in enumerate(plan.stages):
        servers = by_server(cluster, plan.gradient_groups(s)[0])
        if len(servers) < 2:
            continue
        dense = model.stage_param_bytes(*stage.layers) - model.expert_param_bytes(*stage.layers)
        nbytes = gradient_sync_bytes(dense * model.grad_bytes_per_param_byte, plan.sharding, param_bytes=dense)
        # ZeRO-3's reduce-scatter: laid out as an all-reduce of half, run by NCCL as a reduce-scatter of all
        kind, nbytes = ("reduce-scatter", 2 * nbytes) if plan.sharding is Sharding.FULL else ("all-reduce", nbytes)
        choice = across_choice([len(g) for g in servers], nbytes, cluster, kind=kind,
                               crossing=group_crossing(cluster, [g[0] for g in servers]))
        line = choice_text(format_bytes(nbytes), choice, kind)
        if line not in lines:
            lines.append(line)
    return tuple(lines)


def fabric_line(cluster) -> str:
    """``rack (2 servers) > pod (192, 1:7 up) > core (8); rail-optimised; scale-up 72 GPUs``; empty without a fabric."""
    fabric = cluster.fabric
    if fabric is None:
        return ""
    ratios = [oversubscription_of(cluster, i) for i in range(len(fabric.tiers))]
    tiers = " > ".join(f"{t.name} ({'all' if t.size is None else t.size}"
                       + (f", 1:{ratio:g} up" if ratio > 1 else "") + ")" for t, ratio in zip(fabric.tiers, ratios))
    extra = "; rail-optimised" if fabric.rail_optimised else ""
    if fabric.servers_per_domain > 1:
        extra += f"; scale-up domains of {cluster.devices_per_node} GPUs ({fabric.servers_per_domain} servers each)"
    return tiers + extra


def run_keys(scenario: Scenario) -> tuple[tuple[str, str], ...]:
    """The run's keys and the values used (a default said as such); empty when the scenario
    sets neither a run length nor a reliability section."""
    training, cluster, device, spec = scenario.training, scenario.cluster, scenario.cluster.device, scenario.reliability
    if training.steps is None and spec is None:
        return ()
    unset = (lambda value, text="not set": text if value is None else f"{value:g}")
    keys = [("training.steps", "not set" if training.steps is None else f"{training.steps:,}"),
            ("training.tokens", unset(training.tokens)),
            ("cluster.price_per_gpu_hour", unset(cluster.price_per_gpu_hour)),
            ("cluster.device.power_w", unset(device.power_w)),
            ("cluster.device.idle_power_w", unset(device.idle_power_w, "not set (counted at power_w)")),
            ("cluster.host_power_w", unset(cluster.host_power_w, "not set (0)")),
            ("cluster.pue", unset(cluster.pue, "not set (1.0)")),
            ("cluster.carbon_g_per_kwh", unset(cluster.carbon_g_per_kwh))]
    if spec is not None:
        keys += [("reliability.gpu_mtbf_h", f"{spec.gpu_mtbf_s / 3600:,.6g} ({spec.source})"),
                 ("reliability.checkpoint.interval", "auto" if spec.checkpoint_interval_s is None
                  else f"{spec.checkpoint_interval_s:g}s"),
                 ("reliability.checkpoint.write_bandwidth", format_bandwidth(spec.write_bandwidth_bytes_per_s)),
                 ("reliability.checkpoint.async", "true" if spec.async_checkpoint else "false"),
                 ("reliability.restart_s", f"{spec.restart_s:g}"),
                 ("reliability.monte_carlo.runs", str(spec.monte_carlo_runs)),
                 ("reliability.monte_carlo.seed", str(spec.seed))]
    return tuple(keys)


def _describe_plan(scenario: Scenario, warnings: list[str]) -> PlanDescription:
    """The plan's stages and devices; appends what looks unintended to ``warnings``."""
    plan, cluster = scenario.plan, scenario.cluster
    spans = _group_spans(plan, cluster)
    for name, span in spans.items():
        if span == "across servers" and name != "data-parallel":  # data parallelism across servers is the norm
            warnings.append(f"{name} groups span servers: {_SPANNING_PATHS[name]} "
                            f"(keep {name} groups inside a server of {cluster.devices_per_node} devices)")
    stages = _describe_stages(scenario, warnings)
    devices = _describe_devices(stages, cluster)
    over = [d.device for d in devices if not d.fits_at_rest]
    if over:
        warnings.append(
            f"devices {_ranges(over)} need {format_bytes(max(d.memory_at_rest_bytes for d in devices))} at rest, "
            f"more than their {_capacity(cluster.device.memory_bytes, cluster.device.usable_memory_bytes)}; "
            "use more stages or fewer layers per stage"
        )
    unused = cluster.num_devices - len(devices)
    if unused:
        warnings.append(f"{unused} of the cluster's {cluster.num_devices} devices are not used by the plan")
    parallelism = ParallelismDescription(
        tensor=plan.tensor_parallel, context=plan.context_parallel, pipeline=len(plan.device_groups),
        sequence_parallel=plan.sequence_parallel, sharding=plan.sharding.value,
        data=max(plan.num_replicas(s) for s in range(plan.num_stages)), expert=plan.expert_parallel,
        expert_tensor=plan.expert_tensor_parallel)
    return PlanDescription(
        schedule=plan.schedule if plan.custom_schedule is None else f"file:{plan.schedule_file}",
        schedule_params=tuple(plan.params.items()), recompute=plan.recompute, num_stages=plan.num_stages,
        parallelism=parallelism, group_spans=tuple(spans.items()), stages=stages, devices=devices,
    )


def _describe_stages(scenario: Scenario, warnings: list[str]) -> tuple[StageDescription, ...]:
    """Each stage's largest replica slice, its cost (the resolved plan's, ``sim.schedule.resolved``:
    the engine's own) and its memory at rest (``StageCost.states``: ``sim.cost.memory.stage_state_bytes``);
    warns of idle replicas."""
    training, plan = scenario.training, scenario.plan
    costs = scenario.resolved.stage_costs
    held = held_by_stage(scenario.resolved)
    stages = []
    for index, stage in enumerate(plan.stages):
        start, end = stage.layers
        replicas = plan.num_replicas(index)
        slices = split_samples(training.microbatch_size, replicas)
        cost = costs[index]
        idle = sum(1 for n in slices if n == 0)
        if idle:
            warnings.append(
                f"stage {index}: a micro-batch of {training.microbatch_size} samples over {replicas} "
                f"replicas leaves {idle} replicas idle; use microbatch_size >= {replicas}"
            )
        stages.append(StageDescription(
            stage=index, layers=(start, end), devices=tuple(stage.devices), replicas=replicas,
            samples_per_replica=tuple(slices), param_bytes=cost.param_bytes, fwd_s=cost.fwd_s, bwd_s=cost.bwd_s,
            stash_bytes_per_microbatch=cost.stash_bytes, states=cost.states, held=held[index],
        ))
    return tuple(stages)


def _describe_devices(stages: tuple[StageDescription, ...], cluster) -> tuple[DeviceDescription, ...]:
    """Every device the stages use, by index: its stages' memory at rest, in total (each stage's
    total summed in stage order, as the engine sums them) and by kind (``sum_state_bytes``)."""
    stages_of: dict[int, list[StageDescription]] = {}
    for stage in stages:
        for device in stage.devices:
            stages_of.setdefault(device, []).append(stage)
    devices = []
    for device in sorted(stages_of):
        held = stages_of[device]
        at_rest = sum((stage.memory_at_rest_bytes for stage in held), 0.0)
        devices.append(DeviceDescription(
            device=device, node=cluster.node_of(device), stages=tuple(stage.stage for stage in held),
            memory_at_rest_bytes=at_rest, by_kind=sum_state_bytes(stage.states for stage in held),
            fits_at_rest=at_rest <= cluster.device.usable_memory_bytes,
        ))
    return tuple(devices)


_SPANNING_PATHS = {
    "tensor-parallel": "costed on NCCL's path (sim.cost.group_comm), a ring inside each server and each GPU's "
                       "1/n share across the servers through its own NIC, the GPUs that share a NIC sharing it",
    "context-parallel": "the ring's hops between servers (one out of each server per step) cross the NICs, "
                        "the others stay inside a server, and each step waits for its crossing hop",
}
"""What path a group that spans servers is costed on, by kind (``sim.cost.group_comm``)."""


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
    if plan.expert_parallel > 1:
        spans["expert-parallel"] = _expert_span(plan, cluster)
    return spans


def _expert_span(plan, cluster) -> str:
    """Where the expert-parallel groups sit: ``EP 8 inside a server`` or ``EP 64 across 8 servers,
    8 per server`` (the widest spread of any stage's groups)."""
    ep = plan.expert_parallel
    groups = [g for s in range(plan.num_stages) for g in plan.expert_groups(s)]
    spread = max(groups, key=lambda g: len({cluster.node_of(d) for d in g}))
    servers = len({cluster.node_of(d) for d in spread})
    if servers == 1:
        return f"EP {ep} inside a server"
    return f"EP {ep} across {servers} servers, {-(-ep // servers)} per server"


def _capacity(memory_bytes: float, usable_bytes: float) -> str:
    """``80GiB``, or ``80GiB (77.1GiB usable)`` when the device reserves some of it."""
    if usable_bytes < memory_bytes:
        return f"{format_bytes(memory_bytes)} ({format_bytes(usable_bytes)} usable)"
    return format_bytes(memory_bytes)


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


def _device_defaults_line(description: Description) -> list[str]:
    """The custom device's numbers that the scenario left to their defaults, if any."""
    if not description.device_defaults:
        return []
    used = ", ".join(f"{key} {value}" for key, value in description.device_defaults)
    return [f"device defaults (not in the file; sim.input.cluster): {used}"]


def _stack_lines(description: Description) -> list[str]:
    """The stack's defaults that filled keys the file left open, one line each with its source."""
    if description.stack == "none":
        return []
    lines = [f"stack {description.stack}: {len(description.stack_values)} defaults set (sim.input.stack; "
             "the file's own keys win)"]
    shown = {True: "true", False: "false"}
    return lines + [f"  {v.key} = {shown.get(v.value, v.value) if isinstance(v.value, bool) else v.value}  ({v.source})"
                    for v in description.stack_values]


def format_description(description: Description) -> str:
    """The human-readable form of ``describe``'s result."""
    d, model = description, description.model
    lines = [
        f"scenario {d.name}: {model.name} ({d.num_layers} layers, "
        f"{format_bytes(model.param_bytes)} of {model.dtype} parameters, {model.optimizer}"
        f"{'' if model.attention is None else f', attention {model.attention}'})",
        *_parameter_lines(model),
        *([] if model.vocab_padding is None or not model.vocab_padding.is_padded else [model.vocab_padding.text()]),
        f"cluster: {d.nodes} x {d.devices_per_node} {d.device} = {d.num_devices} devices",
        *_device_defaults_line(d),
        *_stack_lines(d),
        f"training: global batch {d.global_batch_size}, micro-batch {d.microbatch_size} "
        f"-> {d.num_microbatches} micro-batches",
    ]
    if d.run_keys:
        lines += ["run (sim.input.run_section): " + ", ".join(f"{key} {value}" for key, value in d.run_keys)]
    if d.fabric:
        lines.append(f"fabric: {d.fabric}")
    if d.plan is not None:
        lines += _plan_lines(d.plan, _capacity(d.device_memory_bytes, d.device_usable_memory_bytes))
    if d.placement:
        lines.append("placement: " + "; ".join(crossing_text(kind, c) for kind, c in d.placement))
    if d.collectives:
        lines.append("collectives (NCCL's algorithm): " + "; ".join(d.collectives))
    lines += [f"warning: {warning}" for warning in d.warnings]
    return "\n".join(lines)


def _parameter_lines(model) -> list[str]:
    """A mixture of experts' parameters by kind, in one line."""
    counts = model.parameters
    if counts is None:
        return []
    return [f"parameters: {counts.total / 1e9:.2f}B total ({counts.dense / 1e9:.2f}B dense, "
            f"{counts.routed / 1e9:.2f}B routed experts), {counts.active / 1e9:.2f}B active per token"]


def _plan_lines(plan: PlanDescription, capacity: str) -> list[str]:
    """The plan's lines of ``format_description``: schedule, degrees, stages, memory at rest of
    the device's ``capacity`` (``_capacity``)."""
    params = "".join(f", {k}={v}" for k, v in sorted(plan.schedule_params))
    recompute = "" if not plan.recompute else f", recompute {plan.recompute.value}"
    degrees = plan.parallelism
    lines = [
        f"plan: {plan.num_stages} stages, schedule {plan.schedule}{params}{recompute}",
        f"parallelism: tensor {degrees.tensor}{' + sequence' if degrees.sequence_parallel else ''}"
        f" x context {degrees.context} x pipeline {degrees.pipeline} x data {degrees.data}, "
        f"sharding {degrees.sharding}"
        + (f", expert {degrees.expert} x expert-tensor {degrees.expert_tensor}" if degrees.expert > 1
           or degrees.expert_tensor > 1 else "")
        + "".join(f"; {name} groups {span}" for name, span in plan.group_spans),
        f"  {'stage':>5} {'layers':>9} {'replicas':>8} {'fwd/mb':>9} {'bwd/mb':>9} {'at rest':>10}",
    ]
    for stage in plan.stages:
        layers = f"[{stage.layers[0]}, {stage.layers[1]})"
        lines.append(
            f"  {stage.stage:>5} {layers:>9} {stage.replicas:>8} {format_time(stage.fwd_s):>9} "
            f"{format_time(stage.bwd_s):>9} {format_bytes(stage.memory_at_rest_bytes):>10}"
        )
    top = max(plan.devices, key=lambda device: device.memory_at_rest_bytes)
    kinds = ", ".join(f"{kind} {format_bytes(getattr(top.by_kind, kind))}"
                      for kind in ("parameters", "gradients", "optimizer"))
    lines.append(
        f"memory at rest: at most {format_bytes(top.memory_at_rest_bytes)} per device of "
        f"{capacity}; {kinds}"
    )
    unit = max(plan.stages, key=lambda stage: stage.held.backward_bytes)
    if unit.held.forward_bytes or unit.held.backward_bytes:
        lines.append(
            f"sharded by unit: a forward holds up to {format_bytes(unit.held.forward_bytes)} more, a backward "
            f"{format_bytes(unit.held.backward_bytes)} (the live units' unsharded parameters and gradient; "
            f"stage {unit.stage})"
        )
    return lines
