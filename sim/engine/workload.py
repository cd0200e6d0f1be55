"""Workload: a checked scenario compiled into what every device does and through which ports.

The engine (``sim.engine``) and the fast path (``sim.engine.fastpath``) replay the same thing, so it
is computed once, here, with no SimPy:

* the lowered schedule IR (sends, receives and ``REDUCE_GRAD`` added if the plan's schedule
  is compute-only);
* for each device, its slice of every micro-batch (a stage's micro-batch is split over its
  replicas like ``torch.tensor_split``) and what each action costs it in time and memory;
* the *flows*: split-concat traffic between neighbouring stages (each sender ships every
  receiver the part of its slice that the receiver's slice needs, forward activations one
  way and their gradients back) and the phases of each stage's gradient all-reduce;
* the *ports* each flow crosses: inside a server, the sender's out-port and the receiver's
  in-port (``cluster.intra_node``, one per GPU, full duplex); between servers, the sender's
  NIC out and the receiver's NIC in (``cluster.inter_node``, ``nics_per_node`` per server).

Devices that must behave identically are merged into classes (``sim.engine.symmetry``); flows
between classes become *flow kinds*, each crossing *port classes* with a weight (how many
real flows of the kind cross one port of the class). With ``symmetric=False`` every device
and port is its own class, which is slower but useful to check the reduction.

Gradient all-reduce (alpha-beta cost with the ports' bandwidths): inside one server a ring,
``2(n−1)/n · bytes`` per GPU in ``2(n−1)`` steps (Patarasuk & Yuan, JPDC 2009); across
servers hierarchical: ring reduce-scatter inside each server, ring all-reduce of each GPU's
shard across servers through the NICs (``2(k−1)/k · bytes/n``), ring all-gather inside each
server (the NCCL/Horovod hierarchical scheme, Jia et al. 2018, §3).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from sim.cost import split_samples, stage_cost
from sim.faults import jitter_factors
from sim.models import model_flop_per_sample
from sim.input.scenario import Scenario
from sim.schedule.ir import ActionKind, Schedule
from sim.schedule.passes import lower
from sim.schedule.plan_schedule import schedule_for_plan
from sim.engine.symmetry import refine

__all__ = [
    "COMPUTE",
    "SEND",
    "RECV",
    "REDUCE",
    "WGRAD_STASH_FRACTION",
    "Collective",
    "DeviceClass",
    "FlowKind",
    "Op",
    "PortClass",
    "Workload",
    "compile_workload",
    "mailbox",
]

COMPUTE, SEND, RECV, REDUCE = 0, 1, 2, 3
"""Op codes: run on the compute stream, issue flows, wait for flows, join an all-reduce."""

WGRAD_STASH_FRACTION = 0.5
"""Share of a stage's stash a split backward keeps from I until W: the layer inputs that the
weight gradients need (Qi et al., ICLR'24, §2, Table 1 counts W's memory as about half of B's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PortClass:
    """Ports that carry the same load at all times (one or more real ports)."""

    index: int
    name: str
    """``out``/``in`` (a GPU's intra-node port) or ``nic-out``/``nic-in``, with a member id."""
    bandwidth_bytes_per_s: float
    size: int
    """Number of real ports in the class."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowKind:
    """Real flows with the same label between the same two device classes."""

    index: int
    label: tuple
    """``("F", s)`` activations of stage s to s+1, ``("B", s)`` gradients of stage s to s−1,
    ``("AR", s, phase)`` an all-reduce phase of stage s."""
    src_class: int
    dst_class: int
    bytes: float
    """Bytes of one real flow (per micro-batch for point-to-point flows)."""
    latency_s: float
    ports: tuple[tuple[int, float], ...]
    """(port class, real flows of this kind on each port of that class)."""
    static_rate_bytes_per_s: float
    """Rate when only the operation it belongs to runs (no contention from others)."""
    send_bytes_per_device: float
    recv_bytes_per_device: float
    issue_s: float = 0.0
    """Seconds the flows of this kind hold up each sending device's compute stream
    (``LinkSpec.send_issue_s`` of each real flow it sends)."""
    receive_s: float = 0.0
    """Seconds the flows of this kind cost each receiving device's compute stream
    (``LinkSpec.recv_overhead_s`` per real flow it receives)."""


class Op(NamedTuple):
    """One action of a device class, ready to replay.

    A named tuple rather than a frozen dataclass: a plan compiles to hundreds of thousands of
    them in the planner's inner loop, and a tuple is built several times faster.
    """

    code: int
    """COMPUTE, SEND, RECV or REDUCE."""
    text: str
    """The IR action (``2F0``)."""
    stage: int
    kind: ActionKind
    microbatch: int | None
    duration_s: float = 0.0
    """COMPUTE: its time; SEND: how long issuing it holds up the compute stream; RECV: what
    taking its data in costs the compute stream once it has arrived."""
    alloc_bytes: float = 0.0
    """Bytes allocated when the action starts (stash, recomputed activations)."""
    free_bytes: float = 0.0
    """Activation bytes freed when it ends (its stash, recomputed activations)."""
    buffer_bytes: float = 0.0
    """Receive-buffer bytes it consumes, freed when it ends (its input or output gradient)."""
    live_delta: int = 0
    """+1 when a micro-batch's activations become live (F), −1 when they die (B or W)."""
    flows: tuple[int, ...] = ()
    """SEND: flow kinds to start; RECV: flow kinds to wait for."""
    collective: int = -1
    """REDUCE: index of the all-reduce, or −1 when the stage has one replica."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceClass:
    """Devices that run the same actions at the same times; one represents all."""

    index: int
    devices: tuple[int, ...]
    rank: int
    stages: tuple[int, ...]
    samples: tuple[int, ...]
    """Samples of each micro-batch each of its stages processes on one device."""
    ops: tuple[Op, ...]
    static_bytes: float
    """Parameters, gradients and optimizer state held at rest, per device."""
    optimizer_s: float
    """Optimizer step over the parameters of its stages (``sim.cost.optimizer_step_s``)."""
    slowdown: float = 1.0
    """Straggler factor on compute actions that start at or after ``slow_from_s``."""
    slow_from_s: float = 0.0
    fails_at_s: float | None = None
    """When the (single) device of this class dies, if it does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One stage's gradient all-reduce: phases of concurrent flows, one after another."""

    index: int
    stage: int
    participants: tuple[int, ...]
    """Device classes taking part."""
    phases: tuple[tuple[tuple[int, ...], float], ...]
    """(flow kinds, latency steps in seconds) per phase."""
    bytes: float
    """Gradient bytes per device."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Everything a replay needs; produced by :func:`compile_workload`."""

    name: str
    schedule: Schedule
    """Lowered IR, one list per pipeline rank."""
    num_microbatches: int
    global_batch_size: int
    classes: tuple[DeviceClass, ...]
    kinds: tuple[FlowKind, ...]
    port_classes: tuple[PortClass, ...]
    collectives: tuple[Collective, ...]
    device_memory_bytes: float
    flop_per_iteration: float | None
    """Model FLOPs of one iteration when the model's FLOPs are known (for MFU)."""
    peak_flop_per_s: float
    schedule_name: str
    num_stages: int
    recompute: bool

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(d for c in self.classes for d in c.devices))

    @property
    def num_devices(self) -> int:
        return sum(len(c.devices) for c in self.classes)


# --- compilation ---------------------------------------------------------------------------


def compile_workload(scenario: Scenario, *, symmetric: bool = True) -> Workload:
    """Compile ``scenario`` (which must have a plan) for replay."""
    plan, cluster, model, training = scenario.plan, scenario.cluster, scenario.model, scenario.training
    assert plan is not None, "the caller checks that the scenario has a plan"
    schedule = schedule_for_plan(plan, training.num_microbatches)
    if not schedule.is_lowered:
        schedule = lower(schedule)
    stage_ranks, groups = plan.stage_ranks, plan.device_groups
    devices = sorted(d for g in groups for d in g)
    local = {d: i for i, d in enumerate(devices)}
    rank_of = {d: r for r, g in enumerate(groups) for d in g}
    samples = {s: _sample_ranges(training.microbatch_size, st.devices) for s, st in enumerate(plan.stages)}
    stages_of_rank = [tuple(s for s, r in enumerate(stage_ranks) if r == rank) for rank in range(len(groups))]

    ar_flows, ar_latency = _allreduce_flows(plan, model, cluster)
    flows = _p2p_flows(plan, model, samples) + ar_flows
    nic_ids = sorted({cluster.nic_of(d) for d in devices})
    nic_local = {n: i for i, n in enumerate(nic_ids)}
    faults = _FaultView(scenario.faults, cluster)
    initial = [
        (rank_of[d], tuple(_slice(samples[s], d) for s in stages_of_rank[rank_of[d]]), faults.device_signature(d))
        for d in devices
    ]
    edges = [
        (local[src], local[dst], (label, round(nbytes, 6), cluster.node_of(src) == cluster.node_of(dst)))
        for src, dst, label, nbytes in flows
    ]
    device_class, card_class = refine(initial, [nic_local[cluster.nic_of(d)] for d in devices], edges, len(nic_ids),
                                      [faults.nic_factor(n) for n in nic_ids])
    # identical devices issue each operation together, with or without the reduction
    together = {d: device_class[local[d]] for d in devices}
    if not symmetric:
        device_class, card_class = list(range(len(devices))), list(range(len(nic_ids)))
    class_of = {d: device_class[local[d]] for d in devices}
    card_of = {n: card_class[nic_local[n]] for n in nic_ids}

    ports = _PortTable(cluster, class_of, card_of, devices, nic_ids, faults)
    kinds = _flow_kinds(flows, class_of, together, ports)
    members = defaultdict(list)
    for d in devices:
        members[class_of[d]].append(d)
    collectives = _collectives(plan, model, kinds, class_of, ar_latency)
    by_class = _kinds_by_class(kinds)
    classes = tuple(
        _device_class(index, tuple(members[index]), scenario, schedule, rank_of, stages_of_rank, samples, kinds,
                      collectives, by_class, faults)
        for index in range(len(members))
    )
    flop = model_flop_per_sample(model) if all(not layer.is_measured for layer in model.layers) else None
    return Workload(
        name=scenario.name,
        schedule=schedule,
        num_microbatches=training.num_microbatches,
        global_batch_size=training.global_batch_size,
        classes=classes,
        kinds=tuple(kinds),
        port_classes=ports.classes(),
        collectives=tuple(collectives),
        device_memory_bytes=cluster.device.memory_bytes,
        flop_per_iteration=flop * training.global_batch_size if flop else None,
        peak_flop_per_s=cluster.device.peak_flop_per_s_for(model.dtype),
        schedule_name=plan.schedule if plan.custom_schedule is None else "file",
        num_stages=plan.num_stages,
        recompute=plan.recompute,
    )


def _sample_ranges(microbatch_size: int, devices: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """Device -> half-open range of samples of a micro-batch it processes."""
    sizes = split_samples(microbatch_size, len(devices))
    ends = list(accumulate(sizes))
    return {d: (end - size, end) for d, size, end in zip(devices, sizes, ends)}


def _slice(ranges: dict[int, tuple[int, int]], device: int) -> int:
    start, end = ranges[device]
    return end - start


def _p2p_flows(plan, model, samples) -> list[tuple[int, int, tuple, float]]:
    """Split-concat between neighbouring stages on different ranks: (src, dst, label, bytes)."""
    flows = []
    ranks = plan.stage_ranks
    for s in range(plan.num_stages - 1):
        if ranks[s] == ranks[s + 1]:
            continue
        per_sample = model.boundary_bytes[plan.stages[s].layers[1]]
        for src, (a0, a1) in samples[s].items():
            for dst, (b0, b1) in samples[s + 1].items():
                overlap = min(a1, b1) - max(a0, b0)
                if overlap > 0:
                    flows.append((src, dst, ("F", s), per_sample * overlap))
                    flows.append((dst, src, ("B", s + 1), per_sample * overlap))
    return flows


def _allreduce_flows(plan, model, cluster) -> tuple[list[tuple[int, int, tuple, float]], dict[tuple, float]]:
    """Ring inside a server; reduce-scatter, cross-server ring, all-gather across servers.

    Returns the flows and, per ``(stage, phase)``, the phase's latency: one link latency per
    ring step (a ring of n moves its data in n−1 steps per half).
    """
    flows, latency = [], {}
    for s, stage in enumerate(plan.stages):
        if stage.num_replicas < 2:
            continue
        grad_bytes = model.param_bytes(*stage.layers)
        by_node = defaultdict(list)
        for d in sorted(stage.devices):
            by_node[cluster.node_of(d)].append(d)
        groups = [by_node[n] for n in sorted(by_node)]
        widest = max(len(g) for g in groups)
        if widest > 1:
            # one server: the whole ring all-reduce in one phase; several: its two halves
            halves = 2 if len(groups) == 1 else 1
            for phase in (0,) if len(groups) == 1 else (0, 2):
                latency[(s, phase)] = halves * (widest - 1) * cluster.intra_node.latency_s
                for g in groups:
                    n = len(g)
                    for i, d in enumerate(g if n > 1 else []):
                        flows.append((d, g[(i + 1) % n], ("AR", s, phase), halves * (n - 1) / n * grad_bytes))
        if len(groups) > 1:
            k = len(groups)
            latency[(s, 1)] = 2 * (k - 1) * cluster.inter_node.latency_s
            for j, g in enumerate(groups):
                nxt = groups[(j + 1) % k]
                for i, d in enumerate(g):
                    flows.append((d, nxt[i % len(nxt)], ("AR", s, 1), 2 * (k - 1) / k * grad_bytes / len(g)))
    return flows, latency


class _FaultView:
    """The scenario's faults, as the compiler asks about them."""

    def __init__(self, faults: tuple, cluster) -> None:
        from sim.faults import Failure, Jitter, SlowLink, Straggler

        self.stragglers = {f.device: f for f in faults if isinstance(f, Straggler)}
        self.failures = {f.device: f for f in faults if isinstance(f, Failure)}
        self.jitters = [f for f in faults if isinstance(f, Jitter)]
        self.slow_ports: dict[int, float] = {}
        self.slow_nics: dict[int, float] = {}
        for f in faults:
            if isinstance(f, SlowLink):
                table, key = (self.slow_nics, f.nic) if f.nic is not None else (self.slow_ports, f.device)
                table[key] = table.get(key, 1.0) * f.factor

    def jitter_for(self, device: int):
        return next((j for j in self.jitters if j.applies_to(device)), None)

    def device_signature(self, device: int) -> tuple:
        """What makes a device unlike its replicas (a jittered device is unlike every other)."""
        straggler, failure = self.stragglers.get(device), self.failures.get(device)
        return (
            (straggler.slowdown, straggler.from_s) if straggler else None,
            failure.at_s if failure else None,
            self.slow_ports.get(device, 1.0),
            device if self.jitter_for(device) is not None else None,
        )

    def nic_factor(self, nic: int) -> float:
        return self.slow_nics.get(nic, 1.0)


class _PortTable:
    """Real port ids, their classes and bandwidths (a degraded port has its own class)."""

    def __init__(self, cluster, class_of, card_of, devices, nic_ids, faults: _FaultView):
        self.cluster = cluster
        self.class_of = class_of
        self.card_of = card_of
        self.faults = faults
        self.ids: dict[tuple, int] = {}
        self.info: list[tuple[str, float, int]] = []  # name, bandwidth, size
        sizes = defaultdict(int)
        for d in devices:
            sizes[("out", class_of[d])] += 1
            sizes[("in", class_of[d])] += 1
        for n in nic_ids:
            sizes[("nic-out", card_of[n])] += 1
            sizes[("nic-in", card_of[n])] += 1
        self.sizes = sizes

    def path(self, src: int, dst: int) -> tuple[tuple[tuple, tuple], tuple[int, int], tuple[float, float], float]:
        """(real port keys, port class ids, their bandwidths, latency) of a transfer src -> dst."""
        c, f = self.cluster, self.faults
        if c.node_of(src) == c.node_of(dst):
            real = (("out", src), ("in", dst))
            keys = (("out", self.class_of[src]), ("in", self.class_of[dst]))
            link = c.intra_node
            factors = (f.slow_ports.get(src, 1.0), f.slow_ports.get(dst, 1.0))
        else:
            nics = (c.nic_of(src), c.nic_of(dst))
            real = (("nic-out", nics[0]), ("nic-in", nics[1]))
            keys = (("nic-out", self.card_of[nics[0]]), ("nic-in", self.card_of[nics[1]]))
            link = c.inter_node
            factors = (f.nic_factor(nics[0]), f.nic_factor(nics[1]))
        bandwidths = tuple(link.bandwidth_bytes_per_s * factor for factor in factors)
        ids = tuple(self._id(key, bw) for key, bw in zip(keys, bandwidths))
        return real, ids, bandwidths, link.latency_s

    def link(self, src: int, dst: int):
        """The ``LinkSpec`` of a transfer src -> dst."""
        c = self.cluster
        return c.intra_node if c.node_of(src) == c.node_of(dst) else c.inter_node

    def _id(self, key: tuple, bandwidth: float) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.info)
            self.info.append((f"{key[0]}:{key[1]}", bandwidth, self.sizes[key]))
        return self.ids[key]

    def classes(self) -> tuple[PortClass, ...]:
        return tuple(
            PortClass(index=i, name=name, bandwidth_bytes_per_s=bw, size=size) for i, (name, bw, size) in enumerate(self.info)
        )


def _operation(label: tuple, src: int, together: dict[int, int]) -> tuple:
    """Flows issued together: the sends of one boundary by a class of identical devices (they
    always send at the same instant), or one all-reduce phase."""
    return label if label[0] == "AR" else (label, together[src])


def _flow_kinds(flows, class_of, together, ports: _PortTable) -> list[FlowKind]:
    grouped: dict[tuple, list] = defaultdict(list)
    op_port_load: dict[tuple, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    paths = []
    for src, dst, label, nbytes in flows:
        real, ids, bandwidths, latency = ports.path(src, dst)
        paths.append((real, ids, bandwidths, latency))
        grouped[(label, class_of[src], class_of[dst], round(nbytes, 6))].append(len(paths) - 1)
        for port in real:
            op_port_load[_operation(label, src, together)][port] += 1
    counts = defaultdict(int)
    for d in class_of:
        counts[class_of[d]] += 1
    kinds = []
    for (label, src_class, dst_class, _), members in sorted(grouped.items(), key=lambda item: repr(item[0])):
        src, dst, _, nbytes = flows[members[0]]
        real, ids, bandwidths, latency = paths[members[0]]
        per_port = defaultdict(int)
        for m in members:
            for port_id in paths[m][1]:
                per_port[port_id] += 1
        weights = tuple((pid, per_port[pid] / ports.info[pid][2]) for pid in ids)
        loads = op_port_load[_operation(label, src, together)]
        static_rate = min(bw / loads[port] for bw, port in zip(bandwidths, real))
        link = ports.link(src, dst)
        kinds.append(
            FlowKind(
                index=len(kinds),
                label=label,
                src_class=src_class,
                dst_class=dst_class,
                bytes=nbytes,
                latency_s=latency,
                ports=weights,
                static_rate_bytes_per_s=static_rate,
                send_bytes_per_device=nbytes * len(members) / counts[src_class],
                recv_bytes_per_device=nbytes * len(members) / counts[dst_class],
                issue_s=link.send_issue_s(nbytes) * len(members) / counts[src_class],
                receive_s=(link.recv_overhead_s if nbytes > 0 else 0.0) * len(members) / counts[dst_class],
            )
        )
    return kinds


def _collectives(plan, model, kinds: list[FlowKind], class_of, latency: dict[tuple, float]) -> list[Collective]:
    result = []
    for s, stage in enumerate(plan.stages):
        if stage.num_replicas < 2:
            continue
        phases = []
        for phase in (0, 1, 2):
            members = tuple(k.index for k in kinds if k.label == ("AR", s, phase))
            if members:
                phases.append((members, latency[(s, phase)]))
        participants = tuple(sorted({class_of[d] for d in stage.devices}))
        result.append(
            Collective(
                index=len(result),
                stage=s,
                participants=participants,
                phases=tuple(phases),
                bytes=model.param_bytes(*stage.layers),
            )
        )
    return result


def mailbox(kind: FlowKind, microbatch: int) -> tuple[int, str, int, int]:
    """Where a point-to-point flow's arrival is counted: (receiving class, direction, stage, mb)."""
    direction, stage = kind.label
    return (kind.dst_class, direction, stage + 1 if direction == "F" else stage - 1, microbatch)


def _kinds_by_class(kinds: list[FlowKind]) -> tuple[dict, dict]:
    """Point-to-point kinds leaving and entering each class, by label."""
    out_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    in_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    for k in kinds:
        if k.label[0] != "AR":
            out_kinds[k.src_class][k.label].append(k.index)
            in_kinds[k.dst_class][k.label].append(k.index)
    return out_kinds, in_kinds


def _device_class(index, devices, scenario, schedule, rank_of, stages_of_rank, samples, kinds, collectives, by_class,
                  faults: _FaultView):
    plan, model, cluster = scenario.plan, scenario.model, scenario.cluster
    rank = rank_of[devices[0]]
    stages = stages_of_rank[rank]
    slices = tuple(_slice(samples[s], devices[0]) for s in stages)
    costs, full_stash = {}, {}
    for s, n in zip(stages, slices):
        start, end = plan.stages[s].layers
        costs[s] = stage_cost(model, cluster.device, start, end, n, recompute=plan.recompute)
        full_stash[s] = stage_cost(model, cluster.device, start, end, n).stash_bytes
    out_kinds, in_kinds = by_class[0][index], by_class[1][index]
    collective_of = {c.stage: c.index for c in collectives}
    templates: dict[tuple, dict] = {}  # (stage, kind) -> the op's fields but text and micro-batch
    ops = []
    for a in schedule.ranks[rank]:
        key = (a.stage, a.kind)
        if key not in templates:
            templates[key] = _op_fields(a, costs[a.stage], full_stash[a.stage], plan.recompute, kinds, out_kinds,
                                        in_kinds, collective_of)
        ops.append(Op(text=str(a), microbatch=a.microbatch, **templates[key]))
    jitter = faults.jitter_for(devices[0])
    if jitter is not None:  # a jittered device is alone in its class (its signature is unique)
        compute = [i for i, op in enumerate(ops) if op.code == COMPUTE]
        for i, factor in zip(compute, jitter_factors(jitter, devices[0], len(compute))):
            ops[i] = ops[i]._replace(duration_s=ops[i].duration_s * factor)
    straggler, failure = faults.stragglers.get(devices[0]), faults.failures.get(devices[0])
    return DeviceClass(
        index=index,
        devices=devices,
        rank=rank,
        stages=stages,
        samples=slices,
        ops=tuple(ops),
        static_bytes=sum(costs[s].static_bytes for s in stages),
        optimizer_s=sum(costs[s].optimizer_s for s in stages),
        slowdown=straggler.slowdown if straggler else 1.0,
        slow_from_s=straggler.from_s if straggler else 0.0,
        fails_at_s=failure.at_s if failure else None,
    )


def _op_fields(action, cost, full_stash, recompute, kinds, out_kinds, in_kinds, collective_of) -> dict:
    """Time and memory of one action on one device (see the module docstring), as Op fields."""
    s, kind = action.stage, action.kind
    base = dict(stage=s, kind=kind)
    recv_f = sum(kinds[k].recv_bytes_per_device for k in in_kinds[("F", s - 1)])
    recv_b = sum(kinds[k].recv_bytes_per_device for k in in_kinds[("B", s + 1)])
    # with recompute the forward stashes only its input and the backward rebuilds the rest
    kept = full_stash if recompute else cost.stash_bytes
    rebuilt = full_stash if recompute else 0.0
    extra = cost.stash_bytes if recompute else 0.0
    f = WGRAD_STASH_FRACTION
    if kind is ActionKind.F:
        return dict(code=COMPUTE, duration_s=cost.fwd_s, alloc_bytes=cost.stash_bytes, buffer_bytes=recv_f,
                    live_delta=1, **base)
    if kind is ActionKind.B:
        return dict(code=COMPUTE, duration_s=cost.bwd_s, alloc_bytes=rebuilt, free_bytes=kept + extra,
                    buffer_bytes=recv_b, live_delta=-1, **base)
    if kind is ActionKind.I:
        return dict(
            code=COMPUTE, duration_s=cost.bwd_s - cost.wgrad_s, alloc_bytes=rebuilt,
            free_bytes=(1 - f) * kept + extra, buffer_bytes=recv_b, **base,
        )
    if kind is ActionKind.W:
        return dict(code=COMPUTE, duration_s=cost.wgrad_s, free_bytes=f * kept, live_delta=-1, **base)
    if kind in (ActionKind.SEND_F, ActionKind.SEND_B):
        flows = tuple(out_kinds[("F" if kind is ActionKind.SEND_F else "B", s)])
        return dict(code=SEND, flows=flows, duration_s=sum(kinds[k].issue_s for k in flows), **base)
    if kind in (ActionKind.RECV_F, ActionKind.RECV_B):
        flows = tuple(in_kinds[("F", s - 1)] if kind is ActionKind.RECV_F else in_kinds[("B", s + 1)])
        return dict(code=RECV, flows=flows, duration_s=sum(kinds[k].receive_s for k in flows), **base)
    return dict(code=REDUCE, collective=collective_of.get(s, -1), **base)
